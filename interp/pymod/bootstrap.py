# Run once in every interpreter after Py_Initialize (embedded into the servd module at build time).
# Installs the import hooks: package code comes from the package itself, a few allowed modules come
# from Debian's dist-packages, and nothing else from the machine.
import os
import sys
import importlib
import importlib.machinery
import json
import traceback

import servd

json_loads = json.loads


def json_dumps(value):
    # NaN and Infinity are not JSON: refuse them here rather than hand the host invalid text
    return json.dumps(value, allow_nan=False)


def format_exception(exc):
    return "".join(traceback.format_exception(exc))


class PackageFinder:
    """Imports modules from the package's code/ entries through servd.package (no extraction).

    File names in tracebacks are '<package>/code/<module>.py'; get_source() lets linecache show the
    lines of package code although no such file exists on disk.
    """

    def __init__(self, root, prefix):
        self.root = root
        self.prefix = prefix
        self.files = {n for n in servd.package.file_names() if n.startswith(prefix) and n.endswith(".py")}

    def _locate(self, fullname):
        rel = self.prefix + fullname.replace(".", "/")
        if rel + "/__init__.py" in self.files:
            return rel + "/__init__.py", True
        if rel + ".py" in self.files:
            return rel + ".py", False
        return None, False

    def find_spec(self, fullname, path=None, target=None):
        entry, is_pkg = self._locate(fullname)
        if entry is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=self.root + "/" + entry, is_package=is_pkg)
        spec.has_location = True
        spec.loader_state = entry
        if is_pkg:
            spec.submodule_search_locations = [self.root + "/" + entry.rsplit("/", 1)[0]]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        spec = module.__spec__
        source = servd.package.read_file(spec.loader_state)
        exec(compile(source, spec.origin, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname):
        entry, _ = self._locate(fullname)
        if entry is None:
            raise ImportError("no module named " + repr(fullname) + " in the package", name=fullname)
        return servd.package.read_file(entry).decode("utf-8")

    def is_package(self, fullname):
        return self._locate(fullname)[1]


class AllowFinder:
    """Finds only the named top-level modules (e.g. jinja2, markupsafe) in one directory."""

    def __init__(self, directory, names):
        self.directory = directory
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if path is None and fullname in self.names:
            return importlib.machinery.PathFinder.find_spec(fullname, [self.directory])
        return None


# ---- guards: process-wide calls that would end or hijack the whole server -------------------------
# Every interpreter shares one process with the daemon and the other models, so os._exit() in one
# model's predict would end them all (without a log line), a signal handler would replace the
# daemon's, and a fork would copy every interpreter and thread in an unsafe state. These calls raise
# RuntimeError instead, before any package code runs. The guards stop calls made by mistake or by a
# library; they are not a sandbox: ctypes can still crash the process. Code you do not trust runs
# under process isolation (docs/operations.md).

_REASON_END = "it would end the whole server"
_REASON_FORK = ("it would copy the whole server (every interpreter and thread) into a child in an unsafe "
                "state")
_REASON_EXEC = "it would replace the whole server"
_REASON_SIGNAL = "signal dispositions, masks and timers belong to the whole server, not to one model"
_REASON_FAULT = "fatal-signal handlers belong to the server (it writes the crash report)"


def _refusal(call, why):
    """call: what was called, as the message names it ("os._exit()")."""
    return RuntimeError(call + " is not allowed in servd model code: " + why +
                      " (raise an exception to fail the request)")


def _refuse(name, why):
    def refused(*args, **kwargs):
        raise _refusal(name + "()", why)
    refused.__name__ = refused.__qualname__ = name.rpartition(".")[2]
    return refused


def _signal_zero_only(name, fn, sig_index):
    """Signal 0 only checks that a target exists: allowed."""
    def guarded(*args, **kwargs):
        sig = args[sig_index] if len(args) > sig_index else kwargs.get("signalnum", kwargs.get("signal"))
        if sig != 0:
            raise _refusal(name + "(" + str(sig) + ")", _REASON_END)
        return fn(*args, **kwargs)
    guarded.__name__ = guarded.__qualname__ = name.rpartition(".")[2]
    return guarded


def _own_target(pid, pgid_call):
    """Whether os.kill(pid)/os.killpg(pid) would reach this process or its parent (the server when
    this process is an isolated model's child)."""
    if pgid_call:
        return pid in (0, os.getpgrp())
    return pid in (0, -1, os.getpid(), os.getppid(), -os.getpgrp())


# libc functions that must not be reached through ctypes either (the same calls, by another door).
_FORBIDDEN_SYMBOLS = frozenset(
    "_exit _Exit exit quick_exit abort kill killpg tgkill tkill raise pthread_kill sigqueue signal sigaction "
    "sigprocmask pthread_sigmask alarm setitimer fork vfork _Fork clone clone3 execv execve execvp execvpe "
    "execl execle execlp fexecve posix_spawn posix_spawnp system popen daemon setrlimit prlimit".split())

_AUDIT_REFUSED = {
    "os.fork": ("os.fork", _REASON_FORK),
    "os.forkpty": ("os.forkpty", _REASON_FORK),
    "os.exec": ("os.exec*", _REASON_EXEC),
    "os.posix_spawn": ("os.posix_spawn", _REASON_FORK),
    "os.spawn": ("os.spawn*", _REASON_FORK),
    "os.system": ("os.system", _REASON_FORK),
    "subprocess.Popen": ("subprocess.Popen", _REASON_FORK),
    "resource.setrlimit": ("resource.setrlimit", "resource limits apply to the whole server"),
    "resource.prlimit": ("resource.prlimit", "resource limits apply to the whole server"),
}


# ---- capabilities: what package code may do only when its manifest declares it --------------------
# "capabilities": ["native"] lets it run native code through ctypes or cffi (a bad pointer crashes the
# whole server); ["fd"] lets it close, replace or write file descriptors it did not open itself (the
# server's sockets, its event loop's descriptors: closing them aborted servd). Undeclared, they raise
# PermissionError naming the call and the capability. Interpreters without a package (the host's own
# calls, tests) have every capability. docs/interpreters.md, "Capabilities".

_ALL_CAPABILITIES = frozenset(("native", "fd"))
_caps = _ALL_CAPABILITIES
_owned_fds = set()  # descriptors this interpreter's code opened (os.open, os.pipe, os.dup, ...)

# ctypes' and cffi's ways into native code. ctypes' own import only opens the running program
# (dlopen(None)), which is allowed: importing ctypes is harmless, reaching a symbol or an address is not.
_NATIVE_EVENTS = frozenset(("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
                            "ctypes.string_at", "ctypes.wstring_at", "ctypes.cdata", "ctypes.addressof"))
_NATIVE_MODULES = frozenset(("cffi", "_cffi_backend"))


def _undeclared(call, cap, why):
    return PermissionError(call + " is not allowed in this package's code: " + why + "; a package that needs it "
                           "declares it in its manifest (\"capabilities\": [\"" + cap + "\"]) and is best served "
                           "with \"isolation\": \"process\" (docs/interpreters.md, \"Capabilities\")")


_REASON_NATIVE = "native code through ctypes or cffi can crash the whole server"
_REASON_FD = "the descriptor was not opened by this package's code (it may be the server's socket or event loop)"


def _fd_owned(fd):
    return "fd" in _caps or fd in _owned_fds


def _guard_fds():
    """os functions that open descriptors record them as owned; those that close, replace or write one
    check it is owned (or that the package declares "fd")."""
    def opener(name, fn, many=False):
        def opened(*args, **kwargs):
            r = fn(*args, **kwargs)
            _owned_fds.update(r if many else (r,))
            return r
        opened.__name__ = opened.__qualname__ = name
        return opened

    def checked(name, fn, fd_arg=0, forget=False, std_ok=False):
        def guarded(*args, **kwargs):
            fd = args[fd_arg] if len(args) > fd_arg else None
            if isinstance(fd, int) and not _fd_owned(fd) and not (std_ok and fd in (1, 2)):
                raise _undeclared("os." + name + "(" + str(fd) + ")", "fd", _REASON_FD)
            r = fn(*args, **kwargs)
            if forget:
                _owned_fds.discard(fd)
            return r
        guarded.__name__ = guarded.__qualname__ = name
        return guarded

    def closerange(lo, hi):
        for fd in range(lo, hi):
            if not _fd_owned(fd):
                raise _undeclared("os.closerange(" + str(lo) + ", " + str(hi) + ")", "fd", _REASON_FD +
                                  ": " + str(fd) + " is in the range")
        real_closerange(lo, hi)
        _owned_fds.difference_update(range(lo, hi))

    import posix
    real_closerange = posix.closerange
    for mod in (os, posix):
        for name in ("open", "dup", "memfd_create", "eventfd"):
            if hasattr(mod, name):
                setattr(mod, name, opener(name, getattr(posix, name)))
        for name in ("pipe", "pipe2", "openpty"):
            if hasattr(mod, name):
                setattr(mod, name, opener(name, getattr(posix, name), many=True))
        mod.close = checked("close", posix.close, forget=True)
        mod.closerange = closerange
        if hasattr(mod, "dup2"):
            setattr(mod, "dup2", checked("dup2", posix.dup2, fd_arg=1))
        for name in ("write", "writev", "pwrite", "sendfile", "ftruncate"):  # the log (1, 2) is shared
            if hasattr(mod, name):
                setattr(mod, name, checked(name, getattr(posix, name), std_ok=name != "ftruncate"))


def _audit(event, args):
    """An audit hook cannot be removed by Python code: it keeps the guards of the calls that raise
    audit events even when their module is imported again."""
    r = _AUDIT_REFUSED.get(event)
    if r is not None:
        raise _refusal(r[0] + "()", r[1])
    if event == "os.kill" or event == "os.killpg":
        if args[1] != 0 and _own_target(args[0], event == "os.killpg"):
            raise _refusal(event + "(" + str(args[0]) + ", " + str(args[1]) + ")",
                           _REASON_END + " (its own process or process group)")
    elif event == "signal.pthread_kill":
        if args[1] != 0:
            raise _refusal(event + "(..., " + str(args[1]) + ")", _REASON_END + " (a signal to one of its threads)")
    elif event == "ctypes.dlsym" or event == "ctypes.dlsym/handle":
        if args[1] in _FORBIDDEN_SYMBOLS:
            raise _refusal("ctypes access to " + str(args[1]) + "()",
                           "it is a process-wide call (it could end or take over the whole server)")
    if "native" not in _caps:
        if event in _NATIVE_EVENTS and not (event == "ctypes.dlopen" and args[0] is None):
            raise _undeclared(event + "(" + ", ".join(repr(a) for a in args[:2]) + ")", "native", _REASON_NATIVE)
        if event == "import" and args[0] in _NATIVE_MODULES:
            raise _undeclared("import " + args[0], "native", _REASON_NATIVE)
    if event == "open" and isinstance(args[0], int) and not _fd_owned(args[0]):
        raise _undeclared("open(" + str(args[0]) + ")", "fd", _REASON_FD)


def install_guards():
    import posix
    import _signal
    import faulthandler
    import _posixsubprocess

    for mod in (os, posix):
        mod._exit = _refuse("os._exit", _REASON_END)
        mod.abort = _refuse("os.abort", _REASON_END)
    sigmods = [_signal] + [sys.modules[m] for m in ("signal",) if m in sys.modules]
    for mod in sigmods:  # signal.py, imported later, takes these from _signal
        for name in ("signal", "set_wakeup_fd", "setitimer", "alarm", "pthread_sigmask", "siginterrupt",
                     "sigwait", "sigwaitinfo", "sigtimedwait"):
            if hasattr(mod, name):
                setattr(mod, name, _refuse("signal." + name, _REASON_SIGNAL))
        mod.raise_signal = _signal_zero_only("signal.raise_signal", _signal.raise_signal, 0)
    for name in ("enable", "register", "_sigsegv", "_sigabrt", "_sigfpe", "_read_null", "_fatal_error",
                 "_fatal_error_c_thread", "_stack_overflow"):
        if hasattr(faulthandler, name):
            why = _REASON_END if name.startswith("_") else _REASON_FAULT
            setattr(faulthandler, name, _refuse("faulthandler." + name, why))
    real_later = faulthandler.dump_traceback_later

    def dump_traceback_later(timeout, repeat=False, file=sys.stderr, exit=False):
        if exit:
            raise _refusal("faulthandler.dump_traceback_later(exit=True)", _REASON_END)
        return real_later(timeout, repeat, file, False)

    faulthandler.dump_traceback_later = dump_traceback_later
    _posixsubprocess.fork_exec = _refuse("_posixsubprocess.fork_exec", _REASON_FORK)
    sys.addaudithook(_audit)


def setup(pkg_name, allow_dir, allow_modules, extra_sys_path, code_prefix, has_package):
    global _caps
    if has_package:  # checked by the package reader: a list of known capabilities
        _caps = frozenset(servd.package.manifest.get("capabilities", ())) & _ALL_CAPABILITIES
    install_guards()
    if "fd" not in _caps:
        _guard_fds()
    if has_package:
        sys.meta_path.insert(0, PackageFinder(pkg_name or "package", code_prefix))
    if allow_dir and allow_modules:
        sys.meta_path.append(AllowFinder(allow_dir, [m for m in allow_modules.split(",") if m]))
    if extra_sys_path:
        sys.path.extend(p for p in extra_sys_path.split(":") if p)
    sys.dont_write_bytecode = True


def load_entry(spec):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError("entry point must be 'module:callable', not " + repr(spec))
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj()

