"""PluginServer over a real gRPC connection: every RPC of docs/plugin-protocol.md."""

import math
import queue
import threading
import time
import unittest

import grpc

import switchyard_plugin as sp
from switchyard_plugin import server as srv
from switchyard_plugin._pb import grpc_controller_pb2, health_pb2
from switchyard_plugin._pb import plugin_pb2 as pb

from .helpers import TIMEOUT, Served

BIG = (1 << 64) - 5  # a worker id above 2^53: a float would lose it


class KeepEven:
    """Keeps the rows whose worker id is even."""

    def inputs(self):
        return sp.Inputs.NONE

    def filter(self, req, cands):
        return [i % 2 == 0 for i in cands.ids]


class Active:
    """Scores active_requests * factor; fails as its params say."""

    def __init__(self, factor=1.0, mode=""):
        self.factor, self.mode = factor, mode

    def inputs(self):
        return sp.Inputs.ACTIVE_REQUESTS

    def score(self, req, cands):
        if self.mode == "error":
            raise sp.ComponentError("no score today")
        if self.mode == "raise":
            raise KeyError("boom")
        if self.mode == "nan":
            return [math.nan] * len(cands)
        if self.mode == "short":
            return [1.0]
        if self.mode == "slow":
            SLOW.wait(TIMEOUT)
        if self.mode == "sleep":
            time.sleep(0.05)
        return [a * self.factor for a in cands.active_requests]


SLOW = threading.Event()


class MaxID:
    """Picks the row with the highest worker id (exact 64-bit comparison) and
    records the costs it saw."""

    seen = queue.SimpleQueue()

    def pick(self, req, cands):
        MaxID.seen.put(None if cands.costs is None else list(cands.costs))
        return max(range(len(cands)), key=lambda i: cands.ids[i])


class Listener:
    """A scorer that hears events."""

    def __init__(self):
        self.events = []

    def score(self, req, cands):
        return [0.0] * len(cands)

    def on_events(self, events):
        self.events.extend(events)


class Partitions:
    """A classifier factory: each partition's classifier counts the
    completed events it heard and answers them as the priority."""

    def __init__(self):
        self.made = []

    def new_classifier(self, pc):
        c = Counting(pc)
        self.made.append(c)
        return c


class Counting:
    def __init__(self, pc):
        self.pc, self.completed = pc, 0

    def classify(self, req):
        if req.metadata.get("fail") == "yes":
            raise sp.ComponentError("refused")
        return sp.Classification(
            priority=self.completed,
            policy_class=f"{self.pc.model}/{self.pc.role}/{len(self.pc.workers())}",
            due_unix_nano=self.pc.now_unix_nano() + 5,
            target=BIG,
        )

    def on_events(self, events):
        self.completed += sum(1 for e in events if e.kind == sp.EventKind.COMPLETED)


class Fixed:
    """Picks the row its parameter says, as an int or a float."""

    def __init__(self, p):
        self.row, self.as_float = p["row"], p["as_float"]

    def pick(self, req, cands):
        return float(self.row) if self.as_float else self.row


def make_active(info, p):
    return Active(p["factor"], p.get("mode", ""))


TYPES = [
    sp.TypeInfo(name="even", kind=sp.Kind.FILTER, doc="Keeps even ids.", new=lambda i, p: KeepEven()),
    sp.TypeInfo(
        name="active",
        kind=sp.Kind.SCORER,
        inputs=sp.Inputs.ACTIVE_REQUESTS,
        doc="Scores active requests.",
        params=[
            sp.ParamSpec("factor", sp.ParamType.NUMBER, "Multiplier.", default=1),
            sp.ParamSpec("mode", sp.ParamType.STRING, "How to fail."),
        ],
        new=make_active,
    ),
    sp.TypeInfo(name="max-id", kind=sp.Kind.PICKER, doc="Highest id.", new=lambda i, p: MaxID()),
    sp.TypeInfo(name="fixed", kind=sp.Kind.PICKER, doc="Picks a fixed row.", new=lambda i, p: Fixed(p), params=[
        sp.ParamSpec("row", sp.ParamType.INT, "The row.", default=0),
        sp.ParamSpec("as_float", sp.ParamType.BOOL, "Answer a float.", default=False),
    ]),
    sp.TypeInfo(name="listen", kind=sp.Kind.SCORER, doc="Hears events.", new=lambda i, p: Listener()),
    sp.TypeInfo(name="count", kind=sp.Kind.CLASSIFIER, doc="Counts.", events=True, new=lambda i, p: Partitions()),
]


def value(**kw):
    return pb.Value(**kw)


def task(task_id, stages, ids, active=None, costs=None, deadline=0, **req):
    cols = pb.Columns(ids=ids, active_requests=active or [], costs=costs or [])
    return pb.DecideTask(
        task_id=task_id,
        request=pb.Request(id="r1", model="m", role="aggregated", **req),
        candidates=cols,
        stages=[pb.Stage(instance=name, weight=w) for name, w in stages],
        deadline_unix_nano=deadline,
    )


class ServerTest(unittest.TestCase):
    def setUp(self):
        self.s = Served(TYPES)
        self.addCleanup(self.s.close)

    def configure(self, instance, type_, role="aggregated", **params):
        return self.s.stub.Configure(
            pb.ConfigureRequest(instance=instance, type=type_, role=role, block_size=16, params=params), timeout=TIMEOUT
        )

    def decide(self, *tasks):
        """Sends the tasks in one DecideBatch and returns the results by task
        id, in the order received."""
        out = {}
        reqs = queue.SimpleQueue()
        reqs.put(pb.DecideBatch(tasks=list(tasks)))

        def gen():
            while True:
                item = reqs.get()
                if item is None:
                    return
                yield item

        stream = self.s.stub.Decide(gen(), timeout=TIMEOUT)
        for msg in stream:
            for r in msg.results:
                out[r.task_id] = r
            if len(out) == len(tasks):
                reqs.put(None)
        return out

    def test_describe(self):
        d = self.s.stub.Describe(pb.DescribeRequest(api_versions=[1]), timeout=TIMEOUT)
        self.assertEqual(d.plugin_version, "1.2.3")
        self.assertEqual(list(d.api_versions), [1])
        self.assertEqual([t.name for t in d.types], ["even", "active", "max-id", "fixed", "listen", "count"])
        active = d.types[1]
        self.assertEqual(active.kind, pb.KIND_SCORER)
        self.assertEqual(active.inputs, 1)
        self.assertEqual([(p.name, p.type, p.doc) for p in active.params],
                         [("factor", pb.PARAM_TYPE_NUMBER, "Multiplier."), ("mode", pb.PARAM_TYPE_STRING, "How to fail.")])
        # An int default of a number parameter travels as a number.
        self.assertEqual(active.params[0].default.WhichOneof("kind"), "number")
        self.assertEqual(active.params[0].default.number, 1.0)
        self.assertFalse(active.params[1].HasField("default"))

    def test_configure_refusals_name_the_parameter(self):
        r = self.configure("a", "active", factor=value(string="x"), colour=value(int=3))
        self.assertEqual([(d.param, d.summary) for d in r.diagnostics], [
            ("colour", 'unsupported parameter "colour" for type "active"'),
            ("factor", 'parameter "factor": got a string value, want number'),
        ])
        r = self.configure("a", "nope")
        self.assertEqual(r.diagnostics[0].param, "")
        self.assertEqual(r.diagnostics[0].summary, 'unknown component type "nope"')
        # An int is accepted for a number; the defaults are filled.
        r = self.configure("a", "active", factor=value(int=2))
        self.assertEqual(len(r.diagnostics), 0)
        self.assertEqual(r.inputs, 1)
        self.assertFalse(r.events)

    def test_configure_constructor_errors(self):
        def bad(info, p):
            raise ExceptionGroup("two", [sp.ParamError("a", "too big"), sp.ParamError("b", "too small")])

        def whole(info, p):
            raise ValueError("the block makes no sense")

        def required(info, p):
            return Active()

        s = Served([
            sp.TypeInfo(name="bad", kind=sp.Kind.SCORER, doc="d", new=bad),
            sp.TypeInfo(name="whole", kind=sp.Kind.SCORER, doc="d", new=whole),
            sp.TypeInfo(name="req", kind=sp.Kind.SCORER, doc="d", new=required,
                        params=[sp.ParamSpec("n", sp.ParamType.INT, "n.", required=True)]),
            sp.TypeInfo(name="notscorer", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: KeepEven()),
        ])
        self.addCleanup(s.close)
        cfg = lambda t: s.stub.Configure(pb.ConfigureRequest(instance="i", type=t), timeout=TIMEOUT)  # noqa: E731
        self.assertEqual([(d.param, d.summary) for d in cfg("bad").diagnostics],
                         [("a", 'parameter "a": too big'), ("b", 'parameter "b": too small')])
        self.assertEqual([(d.param, d.summary) for d in cfg("whole").diagnostics], [("", "the block makes no sense")])
        self.assertEqual([(d.param, d.summary) for d in cfg("req").diagnostics], [("n", 'missing required parameter "n"')])
        self.assertEqual(cfg("notscorer").diagnostics[0].summary,
                         'type "notscorer": KeepEven does not implement the scorer interface')

    def test_decide_pipeline_answers_in_sent_rows(self):
        self.configure("f", "even")
        self.configure("s", "active", factor=value(number=0.5))
        self.configure("p", "max-id")
        ids = [2, 3, BIG - 1, BIG]
        r = self.decide(task(7, [("f", 0), ("s", 2.0), ("p", 0)], ids, active=[4, 5, 6, 7], costs=[1, 1, 10, 1]))[7]
        self.assertEqual(r.error, "")
        self.assertEqual(list(r.kept), [0, 2])  # ids 2 and BIG-1 are even
        self.assertEqual(list(r.costs), [4.0, 6.0])  # weight 2 * 0.5 * active: this task's sum only
        self.assertEqual(r.picked, 2)  # BIG-1, an index into the rows as sent
        self.assertEqual(MaxID.seen.get(timeout=TIMEOUT), [5.0, 16.0])  # incoming costs plus the task's
        # No filter: kept empty (every row); no picker: picked -1.
        r = self.decide(task(8, [("s", 1.0)], [1, 2], active=[3, 1]))[8]
        self.assertEqual((list(r.kept), list(r.costs), r.picked), ([], [1.5, 0.5], -1))  # factor 0.5

    def test_decide_all_filtered(self):
        self.configure("f", "even")
        self.configure("p", "max-id")
        r = self.decide(task(1, [("f", 0), ("p", 0)], [1, 3]))[1]
        self.assertEqual((r.filtered_by, list(r.kept), r.picked, r.error), ("f", [], -1, ""))

    def test_decide_errors(self):
        for mode, want in [
            ("error", 'scorer "s-error": no score today'),
            ("raise", "scorer \"s-raise\" panicked: KeyError: 'boom'"),
            ("nan", "scorer s-nan wrote non-finite cost NaN at row 0"),
            ("short", 'scorer "s-short": 1 costs for 2 rows'),
        ]:
            self.configure("s-" + mode, "active", mode=value(string=mode))
            with self.assertLogs("switchyard_plugin", "ERROR") as logs:
                for _ in range(2):
                    r = self.decide(task(1, [("s-" + mode, 1.0)], [1, 2], active=[1, 2]))[1]
                    self.assertEqual((r.error, r.picked, list(r.costs)), (want, -1, []), mode)
                srv.logging.getLogger("switchyard_plugin").error("end")
            # An exception is logged with its traceback, once per 10 s.
            raised = [r for r in logs.records if r.getMessage() == "component raised"]
            self.assertEqual([(r.instance, r.exc_info is not None) for r in raised],
                             [("s-raise", True)] if mode == "raise" else [])
        r = self.decide(task(2, [("ghost", 1.0)], [1]))[2]
        self.assertEqual(r.error, 'unknown instance "ghost" (not configured)')
        self.configure("s", "active")
        r = self.decide(task(3, [("s", 1.0)], [1], active=[1], deadline=time.time_ns() - 1))[3]
        self.assertEqual(r.error, "deadline passed before the task ran")
        r = self.decide(task(4, [("s", 1.0)], [1, 2], active=[1]))[4]
        self.assertEqual(r.error, "column active_requests has 1 entries for 2 rows")
        self.configure("p5", "fixed", row=value(int=5))
        self.configure("pf", "fixed", row=value(int=1), as_float=value(bool=True))
        self.configure("p1", "fixed", row=value(int=1))
        for name, want in [("p5", 'picker "p5": row 5 out of range [0, 2)'),
                           ("pf", 'picker "pf": returned 1.0, not a row index'),
                           ("p1", "")]:
            r = self.decide(task(5, [(name, 0)], [1, 2]))[5]
            self.assertEqual((r.error, r.picked), (want, 1 if want == "" else -1), name)
        r = self.decide(task(6, [("p1", 0), ("s", 1.0)], [1, 2], active=[1, 2]))[6]
        self.assertEqual(r.error, 'picker "p1" is not the task\'s last stage')

    def test_decide_batch_answers_out_of_order(self):
        """A slow task does not hold up the next task of its batch: its
        answer comes after, matched by task id."""
        SLOW.clear()
        self.configure("slow", "active", mode=value(string="slow"))
        self.configure("fast", "active")
        order = []
        reqs = queue.SimpleQueue()
        reqs.put(pb.DecideBatch(tasks=[task(1, [("slow", 1.0)], [1], active=[9]), task(2, [("fast", 1.0)], [1], active=[4])]))
        stream = self.s.stub.Decide(iter(reqs.get, None), timeout=TIMEOUT)
        for msg in stream:
            for r in msg.results:
                order.append((r.task_id, list(r.costs)))
                SLOW.set()  # the slow task finishes only after an answer came
            if len(order) == 2:
                reqs.put(None)
        self.assertEqual(order, [(2, [4.0]), (1, [9.0])])

    def test_lone_tasks_after_a_slow_one_run_off_the_reader(self):
        """A lone task runs on the thread reading the stream only while
        tasks run short: after a slow one, the next lone task runs on the
        pool, so a fast task sent after it is answered first."""
        SLOW.clear()
        self.configure("sleep", "active", mode=value(string="sleep"))
        self.configure("slow", "active", mode=value(string="slow"))
        self.configure("fast", "active")
        reqs = queue.SimpleQueue()
        stream = self.s.stub.Decide(iter(reqs.get, None), timeout=TIMEOUT)
        reqs.put(pb.DecideBatch(tasks=[task(1, [("sleep", 1.0)], [1], active=[1])]))
        order = []
        for msg in stream:
            for r in msg.results:
                order.append(r.task_id)
                if r.task_id == 1:  # now send a slow lone task, then a fast one
                    reqs.put(pb.DecideBatch(tasks=[task(2, [("slow", 1.0)], [1], active=[2])]))
                    reqs.put(pb.DecideBatch(tasks=[task(3, [("fast", 1.0)], [1], active=[3])]))
                else:
                    SLOW.set()
            if len(order) == 3:
                reqs.put(None)
        self.assertEqual(order, [1, 3, 2])

    def test_messages_over_grpc_default_4_mib(self):
        """Both ways, messages over gRPC's default 4 MiB limit go through:
        a task of 600,000 rows (about 7 MB) and its 600,000 costs (4.8 MB)."""
        self.configure("s", "active")
        n = 600_000
        t = task(1, [("s", 1.0)], [BIG - i for i in range(n, 0, -1)], active=[i % 5 for i in range(n)])
        self.assertGreater(t.ByteSize(), 4 << 20)
        r = self.decide(t)[1]
        self.assertEqual(r.error, "")
        self.assertEqual(len(r.costs), n)
        self.assertEqual(list(r.costs[:6]), [0.0, 1.0, 2.0, 3.0, 4.0, 0.0])

    def test_many_tasks_one_stream(self):
        self.configure("s", "active")
        tasks = [task(i, [("s", 1.0)], list(range(1, i % 7 + 2)), active=[i] * (i % 7 + 1)) for i in range(1, 200)]
        got = self.decide(*tasks)
        self.assertEqual(sorted(got), list(range(1, 200)))
        for i, r in got.items():
            self.assertEqual(list(r.costs), [float(i)] * (i % 7 + 1))

    def test_health_and_shutdown(self):
        for name in ("plugin", ""):
            r = self.s.health.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
            self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as e:
            self.s.health.Check(health_pb2.HealthCheckRequest(service="other"), timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        stopped = threading.Event()
        s = Served(TYPES, on_shutdown=stopped.set)
        self.addCleanup(s.close)
        s.controller.Shutdown(grpc_controller_pb2.Empty(), timeout=TIMEOUT)
        self.assertTrue(stopped.is_set())

    def test_classify_waits_for_events_through(self):
        self.assertEqual(len(self.configure("c", "count", role="").diagnostics), 0)
        workers = [pb.WorkerInfo(id=BIG, dp_rank=0, total_kv_blocks=10)]
        req = pb.ClassifyRequest(instance="c", request=pb.Request(id="a", model="m", role="decode"),
                                 workers_version=1, has_workers=True, workers=workers, now_unix_nano=1000)
        r = self.s.stub.Classify(req, timeout=TIMEOUT)
        self.assertEqual((r.priority, r.policy_class, r.due_unix_nano, r.target, r.has_target),
                         (0, "m/decode/1", 1005, BIG, True))
        # A classify that needs event #2 waits for the batch that delivers it.
        fut = self.s.stub.Classify.future(pb.ClassifyRequest(
            instance="c", request=pb.Request(id="b", model="m", role="decode"), events_through=2, now_unix_nano=900),
            timeout=TIMEOUT)
        acks = []
        batches = [
            pb.EventBatch(batch_id=1, instance="c", events=[pb.Event(request_id="a", kind=pb.EVENT_KIND_SENT, worker=BIG, has_worker=True)]),
            pb.EventBatch(batch_id=2, instance="nobody", events=[pb.Event(request_id="z", kind=pb.EVENT_KIND_COMPLETED)]),
            pb.EventBatch(batch_id=3, instance="c", through_seq=2,
                          events=[pb.Event(request_id="a", kind=pb.EVENT_KIND_COMPLETED, context_tokens=12)]),
        ]
        for ack in self.s.stub.Events(iter(batches), timeout=TIMEOUT):
            acks.append(ack.batch_id)
        self.assertEqual(acks, [1, 2, 3])
        r = fut.result(timeout=TIMEOUT)
        # It heard the completion; its clock never goes back (900 < 1000).
        self.assertEqual((r.priority, r.due_unix_nano, r.policy_class), (1, 1005, "m/decode/1"))
        # An older worker list does not replace a newer one.
        old = pb.ClassifyRequest(instance="c", request=pb.Request(id="c", model="m", role="decode"),
                                 workers_version=0, has_workers=True, workers=workers * 3)
        self.assertEqual(self.s.stub.Classify(old, timeout=TIMEOUT).policy_class, "m/decode/1")

    def test_classify_failures(self):
        self.configure("c", "count", role="")
        self.configure("s", "active")
        cases = [
            (pb.ClassifyRequest(instance="x"), grpc.StatusCode.NOT_FOUND, 'unknown instance "x" (not configured)'),
            (pb.ClassifyRequest(instance="s"), grpc.StatusCode.INVALID_ARGUMENT, 'instance "s" is a scorer, not a classifier'),
            (pb.ClassifyRequest(instance="c", request=pb.Request(id="q", metadata={"fail": "yes"})),
             grpc.StatusCode.UNKNOWN, 'classifier c: request "q": refused'),
        ]
        for req, code, msg in cases:
            with self.assertRaises(grpc.RpcError) as e:
                self.s.stub.Classify(req, timeout=TIMEOUT)
            self.assertEqual((e.exception.code(), e.exception.details()), (code, msg))
        with self.assertRaises(grpc.RpcError) as e:
            self.s.stub.Classify(pb.ClassifyRequest(instance="c", events_through=5), timeout=0.5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_events_reach_a_listening_component(self):
        r = self.configure("l", "listen")
        self.assertTrue(r.events)
        batch = pb.EventBatch(batch_id=9, instance="l", events=[
            pb.Event(request_id="a", kind=pb.EVENT_KIND_ABORTED, reason="client cancelled", unix_nano=5)])
        self.assertEqual([a.batch_id for a in self.s.stub.Events(iter([batch]), timeout=TIMEOUT)], [9])
        comp = self.s.plugin._lookup("l").comp
        self.assertEqual(comp.events, [sp.Event(kind=sp.EventKind.ABORTED, request_id="a", worker=None,
                                                reason="client cancelled", unix_nano=5)])


class WireTest(unittest.TestCase):
    def test_values(self):
        for v, t in [(2.5, sp.ParamType.NUMBER), (-(1 << 63), sp.ParamType.INT), (True, sp.ParamType.BOOL),
                     ("x", sp.ParamType.STRING), (20_000_000, sp.ParamType.DURATION)]:
            self.assertEqual(srv.value_from_proto(srv.value_to_proto(v, t), t), v)
        for v, t in [(True, sp.ParamType.INT), (1.5, sp.ParamType.INT), (1 << 63, sp.ParamType.INT), ("1", sp.ParamType.NUMBER)]:
            with self.assertRaises(ValueError):
                srv.value_to_proto(v, t)
        with self.assertRaisesRegex(ValueError, "^empty value, want bool$"):
            srv.value_from_proto(pb.Value(), sp.ParamType.BOOL)

    def test_validate_types(self):
        t = sp.TypeInfo(name="a", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: None,
                        params=[sp.ParamSpec("w", sp.ParamType.INT, "w", default="x")])
        with self.assertRaisesRegex(ValueError, 'type "a" is defined twice; type "a" parameter "w" default'):
            srv.validate_types([t, t])
        with self.assertRaisesRegex(ValueError, "no component types"):
            srv.validate_types([])
        ok = lambda i, p: None  # noqa: E731
        for types, want in [
            (sp.TypeInfo(name="a", kind=sp.Kind.SCORER, doc="d", new=ok), "types must be a list of TypeInfo, got TypeInfo("),
            ([sp.TypeInfo(name="", kind=5, doc="d", new=None, inputs=True)],
             'type #0 has no name; type "" has no callable new; type "" has invalid kind 5; '
             'type "" has inputs True, not an Inputs value of known bits'),
            ([sp.TypeInfo(name="a", kind=sp.Kind.SCORER, doc="d", new=ok, params=[
                sp.ParamSpec("x", sp.ParamType.NUMBER, "x", default=math.nan), sp.ParamSpec("x", 9, "x"),
                "y", sp.ParamSpec("", sp.ParamType.INT, "")])],
             'type "a" parameter "x" default: nan is not a finite number; type "a" parameter "x" is defined twice; '
             'type "a" parameter "x" has invalid type 9; type "a" parameter #2 is \'y\', not a ParamSpec; '
             'type "a" parameter #3 has no name'),
            ([sp.TypeInfo(name="a", kind=sp.Kind.SCORER, doc="d", new=ok, params=sp.ParamSpec("x", sp.ParamType.INT, "x"))],
             'type "a" has params ParamSpec('),
        ]:
            with self.assertRaises(ValueError) as e:
                srv.validate_types(types)
            self.assertTrue(str(e.exception).startswith(want), (str(e.exception), want))

    def test_pack_and_fit(self):
        rs = [pb.DecideResult(task_id=i, costs=[1.0] * 100) for i in range(1, 11)]
        size = rs[0].ByteSize() + 6
        msgs = list(srv._pack(rs, limit=3 * size))
        self.assertEqual([len(m.results) for m in msgs], [3, 3, 3, 1])
        self.assertTrue(all(m.ByteSize() <= 3 * size for m in msgs))
        old = srv.MAX_MESSAGE_BYTES
        srv.MAX_MESSAGE_BYTES = 100
        try:
            r = srv._fit(pb.DecideResult(task_id=4, costs=[1.0] * 20))
        finally:
            srv.MAX_MESSAGE_BYTES = old
        self.assertEqual((r.task_id, r.picked, r.error, list(r.costs)),
                         (4, -1, f"result of {pb.DecideResult(task_id=4, costs=[1.0] * 20).ByteSize()} bytes exceeds the 100-byte limit", []))


if __name__ == "__main__":
    unittest.main()
