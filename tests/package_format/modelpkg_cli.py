"""The modelpkg command line as the package integration tests drive it: run a command, or check that a
bad one fails with exactly one line naming the cause and leaves no output behind."""
import os
import subprocess


class Modelpkg:
    def __init__(self, path):
        self.path = path

    def run(self, *args, ok=True, env=None):
        p = subprocess.run([self.path, *args], capture_output=True, text=True, env=env)
        if ok and p.returncode != 0:
            raise AssertionError(f"modelpkg {args} failed: {p.stderr}")
        return p

    def check_fail(self, args, must_contain, out=None, code=1):
        """`out`, when given, is the output path: nothing starting with its name may be left beside it."""
        p = self.run(*args, ok=False)
        assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and must_contain in lines[0], (must_contain, p.stderr)
        if out:
            d = os.path.dirname(out)
            assert not [f for f in os.listdir(d) if f.startswith(os.path.basename(out))], "output left behind"
