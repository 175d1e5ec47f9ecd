"""What filters and scorers return is checked strictly: wrong answers fail
the task with an error naming the component, never an internal error."""

import fractions
import logging
import math
import unittest

import switchyard_plugin as sp

from switchyard_plugin._pb import plugin_pb2 as pb

from .helpers import TIMEOUT, Served
from . import test_server
from .test_server import task

#: What each instance answers, by instance name: a function of the row count.
ANSWERS = {}


def boom_after_one(n):
    yield True
    raise RuntimeError("generator boom")


class Says:
    """A filter and scorer that answers what ANSWERS says for its instance."""

    def __init__(self, name):
        self.name = name

    def filter(self, req, cands):
        return ANSWERS[self.name](len(cands))

    def score(self, req, cands):
        return ANSWERS[self.name](len(cands))


TYPES = [
    sp.TypeInfo(name="says-filter", kind=sp.Kind.FILTER, doc="d", new=lambda i, p: Says(i.name)),
    sp.TypeInfo(name="says-scorer", kind=sp.Kind.SCORER, doc="d", new=lambda i, p: Says(i.name)),
]


class ResultsTest(unittest.TestCase):
    configure = test_server.ServerTest.configure
    decide = test_server.ServerTest.decide

    def setUp(self):
        self.s = Served(TYPES)
        self.addCleanup(self.s.close)

    def run_one(self, kind, answer, rows=2):
        """Configures an instance answering answer and returns its task's
        result over rows rows."""
        name = f"{kind}-{len(ANSWERS)}"
        ANSWERS[name] = answer
        self.configure(name, "says-" + kind)
        return self.decide(task(1, [(name, 2.0)], list(range(1, rows + 1))))[1], name

    def test_wrong_answers_name_the_component(self):
        cases = [
            ("filter", lambda n: None, 'returned None, not a sequence of bools'),
            ("filter", lambda n: "TT", "returned 'TT', not a sequence of bools"),
            ("filter", lambda n: 7, "returned 7, not a sequence of bools"),
            ("filter", lambda n: {True, False}, "returned {False, True}, not a sequence of bools"),
            ("filter", lambda n: ["False"] * n, "keep flag 'False' at row 0 is not a bool"),
            ("filter", lambda n: [True, math.nan], "keep flag nan at row 1 is not a bool"),
            ("filter", lambda n: [1, 0], "keep flag 1 at row 0 is not a bool"),
            ("filter", lambda n: [True], "1 keep flags for 2 rows"),
            ("filter", lambda n: iter([True] * (n + 5)), "more than 2 keep flags for 2 rows"),
            ("scorer", lambda n: None, "returned None, not a sequence of numbers"),
            ("scorer", lambda n: 10**400, "returned an int of 1329 bits, not a sequence of numbers"),
            ("scorer", lambda n: {"a": 1.0, "b": 2.0}, "returned {'a': 1.0, 'b': 2.0}, not a sequence of numbers"),
            ("scorer", lambda n: ["1"] * n, "cost '1' at row 0 is not a number (int or float)"),
            ("scorer", lambda n: [0.0, True], "cost True at row 1 is not a number (int or float)"),
            ("scorer", lambda n: [0.0, 10**400], "cost an int of 1329 bits at row 1 is too large for a float"),
            ("scorer", lambda n: (0.0 for _ in range(n + 1)), "more than 2 costs for 2 rows"),
            ("scorer", lambda n: [0.0] * 5, "5 costs for 2 rows"),
        ]
        for kind, answer, want in cases:
            r, name = self.run_one(kind, answer)
            self.assertEqual((r.error, r.picked, list(r.costs), list(r.kept)),
                             (f'{kind} "{name}": {want}', -1, [], []), want)
        r, name = self.run_one("scorer", lambda n: [math.inf] * n)
        self.assertEqual(r.error, f"scorer {name} wrote non-finite cost +Inf at row 0")

    def test_right_answers_of_any_sequence(self):
        for kind, answer, costs, kept in [
            ("filter", lambda n: (i == 1 for i in range(n)), [], [1]),
            ("filter", lambda n: (True, False), [], [0]),
            ("scorer", lambda n: range(n), [0.0, 2.0], []),  # ints, weight 2
            ("scorer", lambda n: (x / 2 for x in range(n)), [0.0, 1.0], []),
            ("scorer", lambda n: [fractions.Fraction(1, 4), 3], [0.5, 6.0], []),
        ]:
            r, _ = self.run_one(kind, answer)
            self.assertEqual((r.error, list(r.costs), list(r.kept)), ("", costs, kept), kind)

    def test_a_raising_generator_is_the_components_exception_logged_once(self):
        ANSWERS["gen"] = boom_after_one
        self.configure("gen", "says-filter")
        with self.assertLogs("switchyard_plugin", "ERROR") as logs:
            for i in range(5):
                r = self.decide(task(i + 1, [("gen", 0)], [1, 2]))[i + 1]
                self.assertEqual(r.error, 'filter "gen" panicked: RuntimeError: generator boom')
        # The first is logged with its traceback; the next four, within 10 s, are not.
        self.assertEqual([(rec.getMessage(), rec.instance, rec.exc_info is not None) for rec in logs.records],
                         [("component raised", "gen", True)])

    def test_wrong_answers_are_not_logged(self):
        """A wrong answer is the task's error, like a ComponentError: nothing
        logged, so a replay of many tasks does not flood the log."""
        ANSWERS["none"] = lambda n: None
        self.configure("none", "says-scorer")
        with self.assertLogs("switchyard_plugin", "DEBUG") as logs:
            for i in range(3):
                self.assertEqual(self.decide(task(i + 1, [("none", 1.0)], [1]))[i + 1].error,
                                 'scorer "none": returned None, not a sequence of numbers')
            logging.getLogger("switchyard_plugin").error("end")
        self.assertEqual([rec.getMessage() for rec in logs.records if rec.levelname != "DEBUG"], ["end"])


class Declares:
    """A scorer whose inputs() answers INPUTS[instance name] (raised when an exception)."""

    def __init__(self, name):
        self.name = name

    def inputs(self):
        got = INPUTS[self.name]
        if isinstance(got, Exception):
            raise got
        return got

    def score(self, req, cands):
        return [0.0] * len(cands)


INPUTS = {}


class InputsTest(unittest.TestCase):
    def test_inputs_refused_as_diagnostics(self):
        s = Served([sp.TypeInfo(name="decl", kind=sp.Kind.SCORER, doc="d", inputs=sp.Inputs.LOAD | sp.Inputs.CACHE,
                                new=lambda i, p: Declares(i.name))])
        self.addCleanup(s.close)
        cases = [
            (RuntimeError("inputs boom"), 'type "decl": inputs() raised RuntimeError: inputs boom'),
            (None, 'type "decl": inputs() returned None, not an Inputs value'),
            (True, 'type "decl": inputs() returned True, not an Inputs value'),
            (64 | 4, 'type "decl": inputs() returned 68, which has bits outside the known inputs '
                     '(ACTIVE_REQUESTS|OCCUPANCY|LOAD|CACHE|CAPACITY|LABELS (63))'),
            (-1, 'type "decl": inputs() returned -1, which has bits outside the known inputs '
                 '(ACTIVE_REQUESTS|OCCUPANCY|LOAD|CACHE|CAPACITY|LABELS (63))'),
            (sp.Inputs.LOAD | sp.Inputs.ACTIVE_REQUESTS,
             'type "decl": inputs() returned ACTIVE_REQUESTS|LOAD (5), not a subset of the type\'s declared inputs '
             '(LOAD|CACHE (12))'),
        ]
        for i, (got, want) in enumerate(cases):
            name = f"i{i}"
            INPUTS[name] = got
            with self.assertLogs("switchyard_plugin", "ERROR") as logs:
                r = s.stub.Configure(pb.ConfigureRequest(instance=name, type="decl"), timeout=TIMEOUT)
                logging.getLogger("switchyard_plugin").error("end")
            self.assertEqual([(d.param, d.summary) for d in r.diagnostics], [("", want)])
            # Only an exception is logged, with its traceback.
            self.assertEqual([rec.getMessage() for rec in logs.records],
                             ["inputs() raised", "end"] if i == 0 else ["end"])
            self.assertIsNone(s.plugin._lookup(name))  # not configured
        for i, (got, want) in enumerate([(sp.Inputs.CACHE, 8), (4, 4), (sp.Inputs.NONE, 0)]):
            INPUTS[f"ok{i}"] = got
            r = s.stub.Configure(pb.ConfigureRequest(instance=f"ok{i}", type="decl"), timeout=TIMEOUT)
            self.assertEqual((list(r.diagnostics), r.inputs), ([], want))


if __name__ == "__main__":
    unittest.main()
