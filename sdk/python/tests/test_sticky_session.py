"""The example classifier, examples/sticky_session.py: the Go plugin's
cases (examples/soft-pin-repin/softpin/sticky_test.go)."""

import unittest

import switchyard_plugin as sp

from .helpers import STICKY_EXAMPLE, load_example

st = load_example(STICKY_EXAMPLE)
MINUTE = 60 * 10**9


def partition(workers, clock, **params):
    p = {"ttl": 10 * MINUTE, "max_sessions": 100_000, **params}
    factory = st.STICKY_SESSION.new(sp.InstanceInfo("c", "", 16), p)
    pc = sp.PartitionContext(model="m", role="aggregated", block_size=16,
                             workers=lambda: [sp.WorkerInfo(w, 0, 0) for w in workers],
                             now_unix_nano=lambda: clock[0])
    return factory.new_classifier(pc)


def sent(p, rid, worker, at):
    p.on_events([sp.Event(sp.EventKind.SENT, rid, worker=worker, unix_nano=at),
                 sp.Event(sp.EventKind.COMPLETED, rid, worker=worker, unix_nano=at)])


def req(rid, session=""):
    return sp.Request(id=rid, model="m", role="aggregated", prompt_tokens=1, block_size=16, block_hashes=[],
                      session_id=session, priority=0, metadata={}, cached_prompt_tokens=0)


class StickySessionTest(unittest.TestCase):
    def test_targets_last_worker(self):
        workers, clock = [1, 2], [100 * 10**9]
        p = partition(workers, clock)
        self.assertIsNone(p.classify(req("a", "s")).target)
        sent(p, "a", 2, clock[0])
        self.assertEqual(p.classify(req("b", "s")).target, 2)
        sent(p, "other", 1, clock[0])  # a request it did not classify: ignored
        self.assertEqual(p.classify(req("c", "s")).target, 2)
        self.assertEqual(p.classify(req("d")), sp.Classification())
        workers[:] = [1]  # the worker left: the binding goes
        self.assertIsNone(p.classify(req("e", "s")).target)
        self.assertEqual(len(p.bindings), 0)

    def test_ttl_and_bound(self):
        clock = [100 * 10**9]
        p = partition([1, 2], clock, ttl=MINUTE, max_sessions=2)
        for i in range(3):
            p.classify(req(f"r{i}", f"s{i}"))
            sent(p, f"r{i}", 1, clock[0])
        self.assertEqual(len(p.bindings), 2)
        self.assertIsNone(p.classify(req("x", "s0")).target)  # the least recently used was forgotten
        clock[0] += MINUTE + 10**9
        self.assertIsNone(p.classify(req("y", "s2")).target)  # expired

    def test_params(self):
        for params, param in [({"ttl": 0}, "ttl"), ({"max_sessions": 0}, "max_sessions")]:
            with self.assertRaises(sp.ParamError) as e:
                partition([1], [0], **params)
            self.assertEqual(e.exception.param, param)
        self.assertEqual((st.STICKY_SESSION.kind, st.STICKY_SESSION.events), (sp.Kind.CLASSIFIER, True))


if __name__ == "__main__":
    unittest.main()
