# Run once in every interpreter after Py_Initialize (embedded into the servd module at build time).
# Installs the import hooks: package code comes from the package itself, a few allowed modules come
# from Debian's dist-packages, and nothing else from the machine.
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


def setup(pkg_name, allow_dir, allow_modules, extra_sys_path, code_prefix, has_package):
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

