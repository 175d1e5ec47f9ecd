"""Tests of scripts/routing-quality.py (run by make test).

Bad arguments must exit 2 with a usage message naming the argument, before
any replay runs, never with a Python traceback. A report whose ttft_ms is
null (a policy that completed no request) is marked n/a, never a
traceback: a stand-in router binary writes such reports."""
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


# A stand-in for `router replay --compare FILES --report -`: one record per
# policy file (named by its base name), every TTFT 100 ms, except those of
# the policies named in $FAKE_NULL_TTFT, which are null.
FAKE_ROUTER = """#!%s
import json, os, sys
args = sys.argv[1:]
files = args[args.index("--compare") + 1].split(",")
null = os.environ.get("FAKE_NULL_TTFT", "").split(",")
out = []
for f in files:
    p = os.path.basename(f)[:-len(".hcl")]
    out.append({"policy": p, "kv_hit_ratio": 0.5 if p == "kv-affinity" else 0.4, "kv_hit_reference": 0.52,
                "kv_hit_of_reference": 0.95, "ttft_ms": None if p in null else {"p50": 90, "p90": 100, "p99": 100, "mean": 100}})
json.dump(out, sys.stdout)
"""


class NullTTFT(unittest.TestCase):
    def run_fake(self, null, *args):
        with tempfile.TemporaryDirectory() as d:
            router = os.path.join(d, "router")
            with open(router, "w") as f:
                f.write(FAKE_ROUTER % sys.executable)
            os.chmod(router, 0o755)
            trace = os.path.join(d, "trace.jsonl")
            with open(trace, "w") as f:
                f.write("{}\n")
            env = dict(os.environ, FAKE_NULL_TTFT=",".join(null))
            out = subprocess.run([sys.executable, SCRIPT, "--bin", router, "--workers", "4", *args, trace],
                                 capture_output=True, text=True, timeout=60, env=env)
        self.assertNotIn("Traceback", out.stderr)
        return out

    def test_default_without_ttft_misses(self):
        out = self.run_fake(["kv-affinity"])
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("| kv-affinity (default) | 50.0% (95%) | n/a (none completed) |", out.stdout)
        self.assertIn("| round-robin | 40.0% (95%) | 100 / 100 / 100 |", out.stdout)
        self.assertIn("- 4 workers: MISSED: TTFT p90 <= kv-cost's (n/a against 100.0)", out.stdout)
        self.assertIn("- 4 workers: MISSED: TTFT p99 <= 1.05 x best of rr/ll/p2c (n/a against 105.0)", out.stdout)
        self.assertIn("- 4 workers: met: KV hit >= round-robin's (50.0 against 40.0)", out.stdout)

    def test_baselines_without_ttft(self):
        # Least-loaded alone has a TTFT: the best of the three is its.
        out = self.run_fake(["round-robin", "power-of-two"])
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("- 4 workers: met: TTFT p90 <= 1.05 x best of rr/ll/p2c (100.0 against 105.0)", out.stdout)
        # None of them, nor kv-cost: those checks are not judged, not missed.
        out = self.run_fake(["round-robin", "least-loaded", "power-of-two", "kv"])
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("- 4 workers: not judged: TTFT p90 <= 1.05 x best of rr/ll/p2c (100.0 against n/a)", out.stdout)
        self.assertIn("- 4 workers: not judged: TTFT mean <= kv-cost's (100.0 against n/a)", out.stdout)
        self.assertIn("| kv-cost | 40.0% (95%) | n/a (none completed) |", out.stdout)

    def test_seeds_and_peers_without_ttft(self):
        out = self.run_fake(["kv-affinity", "dynamo", "kv"], "--seeds", "1,2", "--peers")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("- 4 workers: TTFT p90 <= 1.05 x best of rr/ll/p2c: met in 0 of 2 (worst: seed 1, n/a against 105.0)", out.stdout)
        self.assertIn("- 4 workers: TTFT mean <= kv-cost's: met in 0 of 0; not judged in 2 (no policy to compare with completed a request)", out.stdout)
        self.assertIn("| peer: dynamo | 40.0% (95%) | n/a (none completed) |", out.stdout)
        self.assertIn("| peer: llm-d | 40.0% (95%) | 100 / 100 [100-100] / 100 |", out.stdout)


if __name__ == "__main__":
    unittest.main()
