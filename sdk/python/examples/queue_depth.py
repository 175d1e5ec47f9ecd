#!/usr/bin/python3
"""queue-depth, the Go template plugin's scorer (cmd/plugin-example) in Python.

It charges each worker for the requests it is already serving and, when its
engine reports one, its queue:

    cost = active_requests + waiting_weight * waiting

active_requests is the router's in-flight count for the worker
(ACTIVE_REQUESTS); waiting is the engine-reported queue length (LOAD's
load_waiting) when the engine reports one (>= 0) and 0 otherwise. Lower is
better. Same arithmetic as the Go plugin, so a replay with either makes the
same decisions.

The router starts it (a policy's plugin block; see
examples/policies/python-example.hcl); run by hand it exits with a message.
"""

import os
import sys
from typing import List, Sequence

# Finds the SDK in this checkout (sdk/python), so the script runs without
# PYTHONPATH; with the SDK installed or on PYTHONPATH this is harmless.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import switchyard_plugin as sp  # noqa: E402

VERSION = "0.1.0"
TYPE_QUEUE_DEPTH = "queue-depth"
PARAM_WAITING_WEIGHT = "waiting_weight"


class QueueDepth:
    """The queue-depth scorer: stateless, safe for concurrent use.

    It declares ACTIVE_REQUESTS, plus LOAD only when waiting_weight > 0, so
    with waiting_weight = 0 the router skips the load columns altogether.
    """

    def __init__(self, waiting_weight: float) -> None:
        self.waiting_weight = sp.non_negative(PARAM_WAITING_WEIGHT, waiting_weight)

    def inputs(self) -> sp.Inputs:
        if self.waiting_weight > 0:
            return sp.Inputs.ACTIVE_REQUESTS | sp.Inputs.LOAD
        return sp.Inputs.ACTIVE_REQUESTS

    def score(self, req: sp.Request, cands: sp.Candidates) -> Sequence[float]:
        active = cands.active_requests
        if active is None:
            raise sp.ComponentError(f"{TYPE_QUEUE_DEPTH}: declared input column missing: need ACTIVE_REQUESTS")
        costs: List[float] = [float(a) for a in active]
        if self.waiting_weight == 0:
            return costs
        waiting = cands.load_waiting
        if waiting is None:
            raise sp.ComponentError(f"{TYPE_QUEUE_DEPTH}: declared input column missing: need LOAD")
        w = self.waiting_weight
        for i, q in enumerate(waiting):
            if q >= 0:  # -1: the engine reports no queue
                costs[i] += w * float(q)
        return costs


QUEUE_DEPTH = sp.TypeInfo(
    name=TYPE_QUEUE_DEPTH,
    kind=sp.Kind.SCORER,
    inputs=sp.Inputs.ACTIVE_REQUESTS | sp.Inputs.LOAD,
    params=[
        sp.ParamSpec(
            name=PARAM_WAITING_WEIGHT,
            type=sp.ParamType.NUMBER,
            default=1.0,
            doc="Cost per request waiting in the worker's engine queue (engine-reported "
            "Load.waiting; counted as 0 when the engine reports none), relative to 1 per "
            "in-flight request. Unitless, finite, >= 0; default 1. 0 scores in-flight "
            "requests only and stops reading LOAD.",
        )
    ],
    doc="Scores each worker by active_requests + waiting_weight * waiting, in requests: its "
    "in-flight requests plus, when its engine reports a queue, the requests waiting there. "
    "Lower is better. (Python SDK example.)",
    new=lambda info, params: QueueDepth(params[PARAM_WAITING_WEIGHT]),
)

if __name__ == "__main__":
    # The p99 of one Decide under load this plugin expects (plugins check
    # measured 11-22 ms on a busy 2-core machine): the router warns at
    # start when the policy's call_timeout is below it.
    sp.serve(VERSION, [QUEUE_DEPTH], expected_decide_p99=0.025)
