"""The LABELS input, list parameters and worker ids (docs/plugin-protocol.md)."""

import math
import queue
import unittest

import switchyard_plugin as sp
from switchyard_plugin import server as srv
from switchyard_plugin._pb import plugin_pb2 as pb

from .helpers import TIMEOUT, Served


class KeepZone:
    """Keeps the rows whose worker has label zone=ZONE."""

    def __init__(self, zone):
        self.zone = zone

    def inputs(self):
        return sp.Inputs.LABELS

    def filter(self, req, cands):
        return [lab.get("zone") == self.zone for lab in cands.labels]


class PreferNames:
    """Picks the row of the first name of prefer among the candidates, else
    row 0; records what it saw."""

    seen = queue.SimpleQueue()

    def __init__(self, prefer):
        self.prefer = prefer

    def inputs(self):
        return sp.Inputs.LABELS

    def pick(self, req, cands):
        PreferNames.seen.put((list(cands.ids), list(cands.names), [dict(l) for l in cands.labels]))
        for name in self.prefer:
            if name in cands.names:
                return list(cands.names).index(name)
        return 0


TYPES = [
    sp.TypeInfo(name="keep-zone", kind=sp.Kind.FILTER, doc="d", inputs=sp.Inputs.LABELS,
                params=[sp.ParamSpec("zone", sp.ParamType.STRING, "z", default="eu")],
                new=lambda info, p: KeepZone(p["zone"])),
    sp.TypeInfo(name="prefer", kind=sp.Kind.PICKER, doc="d", inputs=sp.Inputs.LABELS,
                params=[sp.ParamSpec("prefer", sp.ParamType.STRING_LIST, "names", default=()),
                        sp.ParamSpec("weights", sp.ParamType.NUMBER_LIST, "w", default=[1, 2.5])],
                new=lambda info, p: PreferNames(p["prefer"])),
]


def labelled_columns(names, zones):
    """Rows for workers named names (ids worker_id_of, ascending), each with
    zone=ZONE and the router's role key, as the router sends them."""
    rows = sorted(zip(names, zones), key=lambda r: sp.worker_id_of(r[0]))
    cols = pb.Columns(ids=[sp.worker_id_of(n) for n, _ in rows], names=[n for n, _ in rows])
    strings = []

    def ref(s):
        if s not in strings:
            strings.append(s)
        return strings.index(s)

    for _, z in rows:
        pairs = sorted({"switchyard.io/role": "aggregated", "zone": z}.items())
        cols.label_counts.append(len(pairs))
        for k, v in pairs:
            cols.label_refs.extend([ref(k), ref(v)])
    cols.label_strings.extend(strings)
    return cols


class LabelsTest(unittest.TestCase):
    def setUp(self):
        self.s = Served(TYPES)
        self.addCleanup(self.s.close)

    def configure(self, instance, type_, **params):
        return self.s.stub.Configure(pb.ConfigureRequest(instance=instance, type=type_, role="aggregated", block_size=16,
                                                         params=params), timeout=TIMEOUT)

    def decide(self, t):
        stream = self.s.stub.Decide(iter([pb.DecideBatch(tasks=[t])]), timeout=TIMEOUT)
        for msg in stream:
            for r in msg.results:
                return r

    def test_worker_id_of(self):
        # The Go tests pin the same values (shared.TestWorkerIDOf).
        self.assertEqual(sp.worker_id_of(""), 14695981039346656037)
        self.assertEqual(sp.worker_id_of("a"), 12638187200555641996)
        self.assertEqual(sp.worker_id_of("sim-3"), 1266439823738918328)
        self.assertEqual(sp.worker_id_of("gpu-0"), 2241005059874422408)

    def test_describe_and_configure_lists(self):
        d = self.s.stub.Describe(pb.DescribeRequest(api_versions=[1]), timeout=TIMEOUT)
        prefer = d.types[1]
        self.assertEqual(prefer.inputs, 32)
        self.assertEqual([(p.name, p.type) for p in prefer.params],
                         [("prefer", pb.PARAM_TYPE_STRING_LIST), ("weights", pb.PARAM_TYPE_NUMBER_LIST)])
        self.assertEqual(list(prefer.params[1].default.number_list.values), [1.0, 2.5])
        self.assertEqual(prefer.params[0].default.WhichOneof("kind"), "string_list")
        r = self.configure("p", "prefer", prefer=pb.Value(string="gpu-1"))
        self.assertEqual([(x.param, x.summary) for x in r.diagnostics],
                         [("prefer", 'parameter "prefer": got a string value, want list(string)')])
        r = self.configure("p", "prefer", prefer=pb.Value(string_list=pb.StringList(values=["gpu-9", "gpu-2"])))
        self.assertEqual(len(r.diagnostics), 0)
        self.assertEqual(r.inputs, 32)

    def test_names_and_labels_reach_components(self):
        self.configure("f", "keep-zone")
        self.configure("p", "prefer", prefer=pb.Value(string_list=pb.StringList(values=["gpu-9", "gpu-3", "gpu-0"])))
        cols = labelled_columns(["gpu-0", "gpu-1", "gpu-2", "gpu-3"], ["us", "eu", "eu", "eu"])
        t = pb.DecideTask(task_id=1, request=pb.Request(id="r", role="aggregated"), candidates=cols,
                          stages=[pb.Stage(instance="f"), pb.Stage(instance="p")])
        r = self.decide(t)
        self.assertEqual(r.error, "")
        # gpu-0 (zone us) is filtered out; the picker prefers gpu-3.
        self.assertEqual(cols.names[r.picked], "gpu-3")
        ids, names, labels = PreferNames.seen.get(timeout=TIMEOUT)
        kept = [i for i, n in enumerate(cols.names) if n != "gpu-0"]
        self.assertEqual(list(r.kept), kept)
        self.assertEqual(names, [cols.names[i] for i in kept])
        self.assertEqual(ids, [sp.worker_id_of(n) for n in names])
        self.assertEqual(labels, [{"switchyard.io/role": "aggregated", "zone": "eu"}] * 3)

    def test_bad_label_columns_fail_the_task(self):
        self.configure("p", "prefer")
        for cols, want in [
            (pb.Columns(ids=[1, 2], label_counts=[1, 2], label_refs=[0, 1, 0, 1], label_strings=["a", "x"]),
             "label_counts add up to 3 labels, label_refs has 2"),
            (pb.Columns(ids=[1], label_counts=[1], label_refs=[0]), "label_refs has 1 entries, not a key and a value"),
            (pb.Columns(ids=[1], label_counts=[1], label_refs=[0, 7], label_strings=["a"]), "refers to string 7 of 1"),
            (pb.Columns(ids=[1], label_refs=[0, 0], label_strings=["a"]), "without label_counts"),
            (pb.Columns(ids=[1, 2], label_counts=[0]), "column label_counts has 1 entries for 2 rows"),
            (pb.Columns(ids=[1, 2], names=["a"]), "column names has 1 entries for 2 rows"),
        ]:
            r = self.decide(pb.DecideTask(task_id=2, request=pb.Request(id="r"), candidates=cols,
                                          stages=[pb.Stage(instance="p")]))
            self.assertIn(want, r.error)


class ListValueTest(unittest.TestCase):
    def test_round_trip(self):
        v = srv.value_to_proto(["a", "b"], sp.ParamType.STRING_LIST)
        self.assertEqual(srv.value_from_proto(v, sp.ParamType.STRING_LIST), ("a", "b"))
        v = srv.value_to_proto((1, 2.5), sp.ParamType.NUMBER_LIST)
        self.assertEqual(srv.value_from_proto(v, sp.ParamType.NUMBER_LIST), (1.0, 2.5))
        self.assertEqual(str(sp.ParamType.STRING_LIST), "list(string)")

    def test_refusals(self):
        for v, t in [("a", sp.ParamType.STRING_LIST), (["a", 1], sp.ParamType.STRING_LIST),
                     ([True], sp.ParamType.NUMBER_LIST), ([math.inf], sp.ParamType.NUMBER_LIST)]:
            with self.assertRaises(ValueError):
                srv.value_to_proto(v, t)
        bad = pb.Value(number_list=pb.NumberList(values=[math.nan]))
        with self.assertRaisesRegex(ValueError, "entry 0 of the number list is nan"):
            srv.value_from_proto(bad, sp.ParamType.NUMBER_LIST)
        with self.assertRaisesRegex(ValueError, "got a list\\(number\\) value, want list\\(string\\)"):
            srv.value_from_proto(bad, sp.ParamType.STRING_LIST)


if __name__ == "__main__":
    unittest.main()
