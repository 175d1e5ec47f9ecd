"""switchyard_plugin.testing.check: `router plugins check` from a test.

Needs a router executable ($SWITCHYARD_ROUTER, or router on PATH): without
one the tests are skipped, unless SWITCHYARD_REQUIRE_ROUTER=1 (cmd/router's
TestPythonTestingCheck builds the router and sets both), when they fail.
"""

import os
import tempfile
import textwrap
import unittest

from switchyard_plugin import testing

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "queue_depth.py")


def router_or_skip(test):
    try:
        return testing.find_router()
    except testing.RouterNotFound as e:
        if os.environ.get("SWITCHYARD_REQUIRE_ROUTER") == "1":
            raise
        test.skipTest(str(e))


def script(test, body):
    """Writes a plugin script of body to a temporary file; returns its path."""
    d = tempfile.mkdtemp()
    test.addCleanup(lambda: __import__("shutil").rmtree(d, ignore_errors=True))
    path = os.path.join(d, "plugin.py")
    with open(path, "w") as f:
        f.write("import time\nimport switchyard_plugin as sp\n" + textwrap.dedent(body))
    return path


class CheckTest(unittest.TestCase):
    def setUp(self):
        router_or_skip(self)

    def test_example_passes_with_replay(self):
        rep = testing.check(EXAMPLE, replay=True, replay_limit=20)
        rep.assert_passed()
        for name in ('decide "queue-depth" rows=4096', 'latency "queue-depth"', 'replay "queue-depth"', "decide batch"):
            c = rep.by_name(name)
            self.assertIsNotNone(c, name)
            self.assertTrue(c.passed, c.line())
        self.assertIn("none fell back", rep.by_name('replay "queue-depth"').note)

    def test_failing_scorer_fails_with_the_routing_reason(self):
        path = script(self, '''
            class S:
                def inputs(self):
                    return 0
                def score(self, req, cands):
                    raise RuntimeError("boom")
            sp.serve("0.1.0", [sp.TypeInfo(name="s", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: S())])
        ''')
        rep = testing.check(path, replay=True, replay_limit=10)
        failed = {c.name: c for c in rep.failed}
        self.assertIn('decide "s" rows=1', failed)
        self.assertEqual(failed['decide "s" rows=1'].expected, "an answer the router accepts")
        self.assertTrue(failed['decide "s" rows=1'].got.startswith('the router would fall back on this decision because scorer "s": '),
                        failed['decide "s" rows=1'].got)
        self.assertIn("boom", failed['decide "s" rows=1'].got)
        self.assertIn('replay "s"', failed)
        self.assertIn("made 10 of 10 selections fall back", failed['replay "s"'].got)
        with self.assertRaises(AssertionError) as cm:
            rep.assert_passed()
        self.assertIn('FAIL decide "s" rows=1: expected an answer the router accepts', str(cm.exception))

    def test_declared_latency_over_call_timeout_warns(self):
        path = script(self, '''
            class S:
                def inputs(self):
                    return 0
                def score(self, req, cands):
                    time.sleep(0.005)
                    return [0.0] * len(cands)
            sp.serve("0.1.0", [sp.TypeInfo(name="slow", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: S())],
                     expected_decide_p99=0.05)
        ''')
        rep = testing.check(path, call_timeout="1ms")
        rep.assert_passed()  # latency is a warning, never a failure
        lat = rep.by_name('latency "slow"')
        self.assertIn("the declared p99 (expected_decide_p99_nanos) 50.00ms over call_timeout 1ms", lat.warning)
        self.assertIn("rows=64 x16 at once p99 ", lat.warning)
        self.assertIn(lat, rep.warnings)


if __name__ == "__main__":
    unittest.main()


class ExpectedP99Test(unittest.TestCase):
    """PluginServer's expected_decide_p99 (seconds) is Describe's
    expected_decide_p99_nanos, rounded up; 0 when not given."""

    def describe(self, **kw):
        from switchyard_plugin._pb import plugin_pb2 as pb

        from .helpers import TIMEOUT, Served, load_example

        s = Served([load_example().QUEUE_DEPTH], **kw)
        self.addCleanup(s.close)
        return s.stub.Describe(pb.DescribeRequest(api_versions=[1]), timeout=TIMEOUT)

    def test_declared(self):
        self.assertEqual(self.describe(expected_decide_p99=0.0025).expected_decide_p99_nanos, 2_500_000)
        self.assertEqual(self.describe().expected_decide_p99_nanos, 0)

    def test_refused(self):
        from switchyard_plugin import PluginServer

        from .helpers import load_example

        for bad in (-1.0, float("nan"), float("inf")):
            with self.assertRaises(ValueError):
                PluginServer("v", [load_example().QUEUE_DEPTH], expected_decide_p99=bad)
