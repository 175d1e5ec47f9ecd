#!/usr/bin/python3
"""sticky-session, the soft-pin-repin plugin's request classifier
(examples/soft-pin-repin/softpin/sticky.go) in Python: a classifier that
learns from lifecycle events.

It sets the advisory target of a session's requests to the worker the
session's last request was sent to. Bindings expire after ttl idle (no
request, send or completion of the session), at most max_sessions are kept
per partition (least recently used forgotten first), and a worker no longer
in the partition drops its binding. Times are the router's clock
(PartitionContext.now_unix_nano, events' unix_nano), so a replay repeats
exactly, and makes the same decisions as the Go plugin's.
"""

import collections
import os
import sys
import threading
from typing import Dict, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import switchyard_plugin as sp  # noqa: E402

VERSION = "0.1.0"
PARAM_TTL = "ttl"
PARAM_MAX_SESSIONS = "max_sessions"
# The most live requests (request id -> session) a partition remembers
# between their classification and their end.
MAX_PENDING = 1 << 16


class StickyPartition:
    """The classifier of one partition; safe for concurrent use."""

    def __init__(self, ttl_ns: int, max_sessions: int, pc: sp.PartitionContext) -> None:
        self.ttl_ns, self.max, self.pc = ttl_ns, max_sessions, pc
        self.lock = threading.Lock()
        # session -> [worker, last unix ns]; the last entry is the most recently used.
        self.bindings: "collections.OrderedDict[str, list]" = collections.OrderedDict()
        self.pending: Dict[str, str] = {}

    def classify(self, req: sp.Request) -> sp.Classification:
        if not req.session_id:
            return sp.Classification()
        now = self.pc.now_unix_nano()
        workers = {w.id for w in self.pc.workers()}
        with self.lock:
            if req.id in self.pending or len(self.pending) < MAX_PENDING:
                self.pending[req.id] = req.session_id
            b = self.bindings.get(req.session_id)
            if b is None:
                return sp.Classification()
            if now - b[1] > self.ttl_ns or (workers and b[0] not in workers):
                del self.bindings[req.session_id]
                return sp.Classification()
            b[1] = now
            self.bindings.move_to_end(req.session_id)
            return sp.Classification(target=b[0])

    def on_events(self, events: Sequence[sp.Event]) -> None:
        with self.lock:
            for ev in events:
                session = self.pending.get(ev.request_id)
                if session is None:
                    continue  # not a request this partition classified
                at = ev.unix_nano or self.pc.now_unix_nano()
                if ev.kind == sp.EventKind.SENT:
                    if ev.worker is not None:
                        self.bind(session, ev.worker, at)
                elif ev.kind == sp.EventKind.COMPLETED:
                    b = self.bindings.get(session)
                    if b is not None and ev.worker is not None and b[0] == ev.worker:
                        b[1] = at
                        self.bindings.move_to_end(session)
                    del self.pending[ev.request_id]
                elif ev.kind == sp.EventKind.ABORTED:
                    del self.pending[ev.request_id]

    def bind(self, session: str, worker: int, at: int) -> None:
        """Binds session to worker, forgetting the least recently used
        binding when max are bound. The lock is held."""
        b = self.bindings.get(session)
        if b is not None:
            b[0], b[1] = worker, at
            self.bindings.move_to_end(session)
            return
        if len(self.bindings) >= self.max:
            self.bindings.popitem(last=False)
        self.bindings[session] = [worker, at]


class StickySession:
    """The classifier factory: one StickyPartition per partition."""

    def __init__(self, params: sp.Params) -> None:
        self.ttl_ns = params[PARAM_TTL]
        if self.ttl_ns <= 0:
            raise sp.ParamError(PARAM_TTL, f"must be > 0, got {self.ttl_ns}ns")
        self.max_sessions = params[PARAM_MAX_SESSIONS]
        if not 1 <= self.max_sessions <= 1 << 30:
            raise sp.ParamError(PARAM_MAX_SESSIONS, f"must be in [1, {1 << 30}], got {self.max_sessions}")

    def inputs(self) -> sp.Inputs:
        return sp.Inputs.NONE  # a classifier reads no candidate column

    def new_classifier(self, pc: sp.PartitionContext) -> StickyPartition:
        return StickyPartition(self.ttl_ns, self.max_sessions, pc)


STICKY_SESSION = sp.TypeInfo(
    name="sticky-session",
    kind=sp.Kind.CLASSIFIER,
    params=[
        sp.ParamSpec(PARAM_TTL, sp.ParamType.DURATION, default=10 * 60 * 10**9,
                     doc="idle time after which a session's binding expires (no request, send or "
                     "completion of the session); > 0"),
        sp.ParamSpec(PARAM_MAX_SESSIONS, sp.ParamType.INT, default=100_000,
                     doc="most sessions bound per partition; binding one more forgets the least "
                     "recently used; >= 1"),
    ],
    events=True,  # the per-partition classifiers listen; the factory does not
    doc="Request classifier: sets a session's requests' advisory target to the worker its last "
    "request was sent to, learned from lifecycle events; bindings expire after ttl idle, at most "
    "max_sessions are kept (LRU), and a worker no longer in the partition drops its binding. "
    "(Python SDK example.)",
    new=lambda info, params: StickySession(params),
)

if __name__ == "__main__":
    sp.serve(VERSION, [STICKY_SESSION])
