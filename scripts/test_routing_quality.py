"""Tests of scripts/routing-quality.py's argument checks (run by make test).

Bad arguments must exit 2 with a usage message naming the argument, before
any replay runs, never with a Python traceback."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "routing-quality.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


class BadArguments(unittest.TestCase):
    def assertUsageError(self, args, want):
        out = run(*args)
        self.assertEqual(out.returncode, 2, f"{args}: exit {out.returncode}, stderr {out.stderr!r}")
        self.assertNotIn("Traceback", out.stderr, args)
        self.assertIn(want, out.stderr, args)

    def test_workers_not_numbers(self):
        for w in ("abc", "", "4,,8", "4.5"):
            self.assertUsageError(["--workers", w], "--workers")

    def test_workers_out_of_range(self):
        for w in ("0", "-3", "4097"):
            self.assertUsageError(["--workers", w], "--workers")

    def test_seeds_not_numbers(self):
        for v in ("x", "1,,2", "1.5"):
            self.assertUsageError(["--seeds", v], "--seeds")

    def test_missing_trace(self):
        self.assertUsageError(["--bin", "/bin/true", "/nonexistent/trace.jsonl"], "no such file")

    def test_workers_repeated(self):
        self.assertUsageError(["--workers", "4,8,4"], "--workers")

    def test_bin_not_executable(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "router")
            self.assertUsageError(["--bin", missing], "--bin")
            with open(missing, "w") as f:
                f.write("not a program\n")
            self.assertUsageError(["--bin", missing], "--bin")


if __name__ == "__main__":
    unittest.main()
