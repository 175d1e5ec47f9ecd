"""The example scorer, examples/queue_depth.py, through the SDK's server:
the Go template plugin's cases (cmd/plugin-example/queuedepth) give the same costs."""

import math
import unittest

from switchyard_plugin._pb import plugin_pb2 as pb

from .helpers import TIMEOUT, Served, load_example

qd = load_example()

# Rows as the router sends them: active requests, and the load columns
# (waiting -1: the engine reports no queue; kv usage NaN: unknown).
ACTIVE = [0, 3, 2, 5]
WAITING = [4, -1, -1, 1]


def load_columns():
    return dict(
        load_available=[True, False, True, True],
        load_active_prefill_tokens=[0, 0, 0, 4096],
        load_active_decode_blocks=[0, 0, 0, 100],
        load_active_requests=[0, 0, 0, 0],
        load_kv_usage=[math.nan, math.nan, 0.9, math.nan],
        load_waiting=WAITING,
    )


class QueueDepthTest(unittest.TestCase):
    def setUp(self):
        self.s = Served([qd.QUEUE_DEPTH], version=qd.VERSION)
        self.addCleanup(self.s.close)

    def score(self, params, with_load):
        r = self.s.stub.Configure(pb.ConfigureRequest(instance="q", type="queue-depth", role="aggregated", params=params),
                                  timeout=TIMEOUT)
        cols = pb.Columns(ids=[1, 2, 3, 4], active_requests=ACTIVE, **(load_columns() if with_load else {}))
        task = pb.DecideTask(task_id=1, request=pb.Request(id="r"), candidates=cols, stages=[pb.Stage(instance="q", weight=1)])
        res = next(iter(self.s.stub.Decide(iter([pb.DecideBatch(tasks=[task])]), timeout=TIMEOUT))).results[0]
        return r, res

    def test_costs(self):
        for name, params, inputs, want in [
            ("default weight 1", {}, 5, [4, 3, 2, 6]),
            ("weight 0.5", {"waiting_weight": pb.Value(number=0.5)}, 5, [2, 3, 2, 5.5]),
            ("weight 2 as an int", {"waiting_weight": pb.Value(int=2)}, 5, [8, 3, 2, 7]),
            ("weight 0: in-flight only", {"waiting_weight": pb.Value(number=0)}, 1, [0, 3, 2, 5]),
        ]:
            cfg, res = self.score(params, with_load=inputs & 4 != 0)
            self.assertEqual((len(cfg.diagnostics), cfg.inputs), (0, inputs), name)
            self.assertEqual((res.error, list(res.costs)), ("", [float(c) for c in want]), name)

    def test_missing_column(self):
        _, res = self.score({}, with_load=False)
        self.assertEqual(res.error, 'scorer "q": queue-depth: declared input column missing: need LOAD')

    def test_refused_weights_name_the_parameter(self):
        for w in (-0.1, math.nan, math.inf):
            r = self.s.stub.Configure(pb.ConfigureRequest(instance="q", type="queue-depth",
                                                          params={"waiting_weight": pb.Value(number=w)}), timeout=TIMEOUT)
            self.assertEqual([(d.param, d.summary) for d in r.diagnostics],
                             [("waiting_weight", f'parameter "waiting_weight": must be a finite number >= 0, got {w}')])


if __name__ == "__main__":
    unittest.main()
