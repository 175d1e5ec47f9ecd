"""The plugin side of switchyard.plugin.v1 and the go-plugin services.

:class:`PluginServer` implements every RPC of docs/plugin-protocol.md
(sections 3 and 8) over a set of :class:`~switchyard_plugin.types.TypeInfo`;
:func:`switchyard_plugin.serve` runs it in a plugin process. Tests use it
directly on a gRPC server of their own.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import numbers
import operator
import queue
import threading
import time
from types import MappingProxyType
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping, Set
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import grpc

from ._pb import grpc_controller_pb2, grpc_controller_pb2_grpc, health_pb2, health_pb2_grpc
from ._pb import plugin_pb2 as pb
from ._pb import plugin_pb2_grpc
from .types import (
    KIND_INTERFACES,
    Candidates,
    Classification,
    ComponentError,
    Event,
    EventKind,
    Inputs,
    InstanceInfo,
    Kind,
    ParamError,
    ParamSpec,
    ParamType,
    ParamValue,
    PartitionContext,
    Request,
    TypeInfo,
    WorkerInfo,
)

#: The plugin API version this SDK speaks (switchyard.plugin.v1).
API_VERSION = 1

#: The most one gRPC message may carry, either way: 64 MiB
#: (docs/plugin-protocol.md section 4, the Go SDK's shared.MaxMessageBytes).
MAX_MESSAGE_BYTES = 64 << 20

#: The gRPC server options every plugin server needs: 64 MiB messages.
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]

#: The health service name go-plugin's client checks.
HEALTH_SERVICE = "plugin"

# What a DecideResult adds to DecideResults besides its own size: a field
# tag and a length prefix.
_RESULT_OVERHEAD = 1 + 5

# The longest the last task may have run for a lone task to run on the
# thread that reads the Decide stream rather than on the pool, seconds.
_INLINE_MAX_SECONDS = 0.001

# How often an instance's exceptions after the first are logged, seconds.
_EXCEPTION_LOG_INTERVAL = 10.0

_UINT64_MAX = (1 << 64) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1

_PARAM_FIELDS = {
    ParamType.NUMBER: "number",
    ParamType.INT: "int",
    ParamType.BOOL: "bool",
    ParamType.STRING: "string",
    ParamType.DURATION: "duration_ns",
    ParamType.STRING_LIST: "string_list",
    ParamType.NUMBER_LIST: "number_list",
}
_FIELD_TYPES = {f: t for t, f in _PARAM_FIELDS.items()}


def quote(s: str) -> str:
    """Quotes s the way Go's %q does for the names the router parses back
    (strconv.QuotedPrefix accepts JSON's escapes)."""
    return json.dumps(s, ensure_ascii=False)


def value_to_proto(v: ParamValue, t: ParamType) -> pb.Value:
    """Converts a parameter value of type t; raises ValueError for a value of
    another type (an int is accepted for a NUMBER, never a bool; a list or
    tuple for a list type, of str or of finite numbers)."""
    if t in (ParamType.STRING_LIST, ParamType.NUMBER_LIST):
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"a {type(v).__name__} value {v!r} is not a {t}")
        if t == ParamType.STRING_LIST:
            if not all(isinstance(e, str) for e in v):
                raise ValueError(f"{v!r} is not a {t}: every entry must be a str")
            return pb.Value(string_list=pb.StringList(values=list(v)))
        if not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
            raise ValueError(f"{v!r} is not a {t}: every entry must be a number")
        for i, e in enumerate(v):
            if not math.isfinite(e):
                raise ValueError(f"entry {i} of the number list is {e}, want a finite number")
        return pb.Value(number_list=pb.NumberList(values=[float(e) for e in v]))
    ok = {
        ParamType.NUMBER: isinstance(v, (int, float)) and not isinstance(v, bool),
        ParamType.INT: isinstance(v, int) and not isinstance(v, bool),
        ParamType.BOOL: isinstance(v, bool),
        ParamType.STRING: isinstance(v, str),
        ParamType.DURATION: isinstance(v, int) and not isinstance(v, bool),
    }.get(t, False)
    if not ok:
        raise ValueError(f"a {type(v).__name__} value {v!r} is not a {t}")
    if t in (ParamType.INT, ParamType.DURATION) and not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"{v} does not fit 64 bits")
    if t == ParamType.NUMBER:
        v = float(v)
    return pb.Value(**{_PARAM_FIELDS[t]: v})


def value_from_proto(v: pb.Value, t: ParamType) -> ParamValue:
    """Converts a wire value to the Python type of t; raises ValueError naming
    both types for another kind (`got a string value, want number`). An int
    is accepted for a number."""
    kind = v.WhichOneof("kind")
    if kind is None:
        raise ValueError(f"empty value, want {t}")
    got = _FIELD_TYPES[kind]
    if got == t == ParamType.STRING_LIST:
        return tuple(v.string_list.values)
    if got == t == ParamType.NUMBER_LIST:
        vs = tuple(v.number_list.values)
        for i, e in enumerate(vs):
            if not math.isfinite(e):
                raise ValueError(f"entry {i} of the number list is {e}, want a finite number")
        return vs
    if got == t:
        return getattr(v, kind)
    if got == ParamType.INT and t == ParamType.NUMBER:
        return float(v.int)
    raise ValueError(f"got a {got} value, want {t}")


def validate_types(types: Sequence[TypeInfo]) -> None:
    """Raises ValueError naming every problem with the types a plugin serves:
    not a list of TypeInfo, none, an empty or duplicate name, no callable
    ``new``, an invalid kind, inputs of unknown bits, parameters that are not
    ParamSpecs, of no name, defined twice, of an invalid type, or with a
    default not of the parameter's type (an int for a number; never NaN or
    an infinity)."""
    if not isinstance(types, (list, tuple)):
        raise ValueError(f"types must be a list of TypeInfo, got {_show(types)}")
    if not types:
        raise ValueError("no component types to serve")
    problems: List[str] = []
    seen = set()
    for i, t in enumerate(types):
        if not isinstance(t, TypeInfo):
            problems.append(f"type #{i} is {_show(t)}, not a TypeInfo")
            continue
        if not isinstance(t.name, str) or not t.name:
            problems.append(f"type #{i} has no name")
        elif t.name in seen:
            problems.append(f'type "{t.name}" is defined twice')
        seen.add(t.name)
        name = quote(str(t.name))
        if not callable(t.new):
            problems.append(f"type {name} has no callable new")
        if t.kind not in KIND_INTERFACES:
            problems.append(f"type {name} has invalid kind {_show(t.kind)}")
        if isinstance(t.inputs, bool) or not isinstance(t.inputs, int) or t.inputs & ~_KNOWN_INPUTS:
            problems.append(f"type {name} has inputs {_show(t.inputs)}, not an Inputs value of known bits")
        if not isinstance(t.params, (list, tuple)):
            problems.append(f"type {name} has params {_show(t.params)}, not a list of ParamSpec")
            continue
        params = set()
        for j, p in enumerate(t.params):
            if not isinstance(p, ParamSpec):
                problems.append(f"type {name} parameter #{j} is {_show(p)}, not a ParamSpec")
                continue
            if not isinstance(p.name, str) or not p.name:
                problems.append(f"type {name} parameter #{j} has no name")
                continue
            if p.name in params:
                problems.append(f'type {name} parameter "{p.name}" is defined twice')
            params.add(p.name)
            if p.type not in _PARAM_FIELDS:
                problems.append(f'type {name} parameter "{p.name}" has invalid type {_show(p.type)}')
            elif p.default is not None:
                try:
                    value_to_proto(p.default, p.type)
                    if p.type == ParamType.NUMBER and not math.isfinite(p.default):
                        raise ValueError(f"{p.default} is not a finite number")
                except ValueError as e:
                    problems.append(f'type {name} parameter "{p.name}" default: {e}')
    if problems:
        raise ValueError("; ".join(problems))


class _LogLimit:
    """Counts failures of one kind and says which to log: the first, then at
    most one every 10 s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._last = -math.inf

    def note(self) -> Tuple[bool, int]:
        """Counts one failure; returns whether to log it and the count so far."""
        with self._lock:
            self._count += 1
            now = time.monotonic()
            log = now - self._last >= _EXCEPTION_LOG_INTERVAL
            if log:
                self._last = now
            return log, self._count


class _Instance:
    """One configured component."""

    def __init__(self, name: str, t: TypeInfo, comp: object, block_size: int) -> None:
        self.name = name
        self.kind = t.kind
        self.type = t
        self.comp = comp
        self.block_size = block_size
        self.partitions: Dict[Tuple[str, str], _Partition] = {}
        self.lock = threading.Lock()
        self.exceptions = _LogLimit()


class _Partition:
    """One classifier partition: created on its first request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while the classifier is made
        self.classifier: Optional[object] = None
        self.version = 0
        self.workers: Tuple[WorkerInfo, ...] = ()


class _TaskError(Exception):
    """A task's failure, answered as DecideResult.error."""


_END = object()  # the Decide stream's input ended


class PluginServer(
    plugin_pb2_grpc.PluginServicer,
    health_pb2_grpc.HealthServicer,
    grpc_controller_pb2_grpc.GRPCControllerServicer,
):
    """Serves ``types`` over switchyard.plugin.v1, with the health and
    controller services go-plugin's client calls.

    ``decide_workers`` threads run Decide tasks, so a slow task does not hold
    up the others (answers then go out in the order tasks finish).
    ``on_shutdown`` is called when the router calls
    ``plugin.GRPCController/Shutdown``.
    """

    def __init__(
        self,
        version: str,
        types: Sequence[TypeInfo],
        log: Optional[logging.Logger] = None,
        decide_workers: int = 4,
        on_shutdown: Callable[[], None] = lambda: None,
        expected_decide_p99: float = 0.0,
    ) -> None:
        validate_types(types)
        if not (expected_decide_p99 >= 0 and expected_decide_p99 < 2**63 / 1e9):
            raise ValueError(f"expected_decide_p99 {expected_decide_p99!r}: want seconds >= 0")
        self._version = version
        # Describe's expected_decide_p99_nanos: seconds, rounded up to ns.
        self._expected_p99_nanos = math.ceil(expected_decide_p99 * 1e9)
        self._types = {t.name: t for t in types}
        self._order = [t.name for t in types]
        self._log = log or logging.getLogger("switchyard_plugin")
        self._instances: Dict[str, _Instance] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, decide_workers), thread_name_prefix="decide")
        self._on_shutdown = on_shutdown
        self._clock = 0  # the latest router clock seen, unix ns
        self._delivered = 0  # the highest through_seq delivered
        self._events_cond = threading.Condition()
        self._internal_errors = _LogLimit()  # the SDK's own failures in Decide

    def add_to(self, server: grpc.Server) -> None:
        """Registers every service on server."""
        plugin_pb2_grpc.add_PluginServicer_to_server(self, server)
        health_pb2_grpc.add_HealthServicer_to_server(self, server)
        grpc_controller_pb2_grpc.add_GRPCControllerServicer_to_server(self, server)

    def close(self) -> None:
        """Stops the Decide worker threads (tasks running finish first)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- health and controller -------------------------------------------

    def Check(self, request, context):  # noqa: N802 - gRPC method name
        if request.service not in ("", HEALTH_SERVICE):
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service}")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Shutdown(self, request, context):  # noqa: N802
        self._log.debug("shutdown requested by the router")
        self._on_shutdown()
        return grpc_controller_pb2.Empty()

    # --- Describe and Configure ------------------------------------------

    def Describe(self, request, context):  # noqa: N802
        resp = pb.DescribeResponse(
            plugin_version=self._version,
            api_versions=[API_VERSION],
            expected_decide_p99_nanos=self._expected_p99_nanos,
        )
        for name in self._order:
            t = self._types[name]
            ct = resp.types.add(name=t.name, kind=int(t.kind), inputs=int(t.inputs), doc=t.doc)
            for p in t.params:
                ps = ct.params.add(name=p.name, type=int(p.type), required=p.required, doc=p.doc)
                if p.default is not None:
                    ps.default.CopyFrom(value_to_proto(p.default, p.type))
        return resp

    def Configure(self, request, context):  # noqa: N802
        def refuse(*diags: Tuple[str, str, str]) -> pb.ConfigureResponse:
            return pb.ConfigureResponse(
                diagnostics=[pb.Diagnostic(param=p, summary=s, detail=d) for p, s, d in diags]
            )

        t = self._types.get(request.type)
        if t is None:
            return refuse(("", f"unknown component type {quote(request.type)}", f"this plugin provides {self._order}"))
        if not request.instance:
            return refuse(("", "empty instance name", ""))
        diags = []
        params: Dict[str, ParamValue] = {}
        for name in sorted(request.params):
            spec = t.param(name)
            if spec is None:
                diags.append((name, f"unsupported parameter {quote(name)} for type {quote(t.name)}", ""))
                continue
            try:
                params[name] = value_from_proto(request.params[name], spec.type)
            except ValueError as e:
                diags.append((name, f"parameter {quote(name)}: {e}", ""))
        for spec in t.params:
            if spec.required and spec.name not in request.params:
                diags.append((spec.name, f"missing required parameter {quote(spec.name)}", ""))
        if diags:
            return refuse(*diags)
        for spec in t.params:
            if spec.name not in params and spec.default is not None:
                params[spec.name] = float(spec.default) if spec.type == ParamType.NUMBER else spec.default
        info = InstanceInfo(name=request.instance, role=request.role, block_size=request.block_size)
        try:
            comp = t.new(info, params)
        except Exception as e:  # noqa: BLE001 - every refusal becomes diagnostics
            return refuse(*_diagnostics(e, self._log, t.name, info.name))
        if comp is None:
            return refuse(("", f"type {quote(t.name)} returned no component", ""))
        if not isinstance(comp, KIND_INTERFACES[t.kind]):
            return refuse(("", f"type {quote(t.name)}: {type(comp).__name__} does not implement the {t.kind} interface", ""))
        events = callable(getattr(comp, "on_events", None)) or (t.kind == Kind.CLASSIFIER and t.events)
        inputs_fn = getattr(comp, "inputs", None)
        inputs = int(t.inputs)
        if callable(inputs_fn):
            try:
                inputs = _instance_inputs(inputs_fn(), t)
            except ValueError as e:
                return refuse(("", f"type {quote(t.name)}: inputs() {e}", ""))
            except Exception as e:  # noqa: BLE001 - a refusal, never a gRPC error
                self._log.error("inputs() raised", exc_info=True, extra={"type": t.name, "instance": info.name})
                return refuse(("", f"type {quote(t.name)}: inputs() raised {type(e).__name__}: {e}", ""))
        with self._lock:
            self._instances[info.name] = _Instance(info.name, t, comp, info.block_size)
        self._log.debug("configured instance %s", info.name, extra={"type": t.name, "role": info.role, "events": events})
        return pb.ConfigureResponse(inputs=inputs, events=events)

    def _lookup(self, name: str) -> Optional[_Instance]:
        with self._lock:
            return self._instances.get(name)

    # --- Decide ----------------------------------------------------------

    def Decide(self, request_iterator, context) -> Iterator[pb.DecideResults]:  # noqa: N802
        """Runs every task received and answers each with one DecideResult,
        several per message when they finish together, in the order they
        finish. Tasks run on the pool, except a lone task on an idle stream
        while the last task ran under 1 ms: that one runs on the thread that
        reads the stream, which saves two thread handoffs per decision."""
        out: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        pending = [0]  # tasks received and not yet answered
        last_run = [0.0]  # how long the last task ran, seconds
        lock = threading.Lock()

        def run(task: pb.DecideTask) -> None:
            start = time.perf_counter()
            r = self.run_task(task)
            last_run[0] = time.perf_counter() - start
            out.put(r)

        def receive() -> None:
            try:
                for batch in request_iterator:
                    tasks = batch.tasks
                    with lock:
                        idle = pending[0] == 0
                        pending[0] += len(tasks)
                    if len(tasks) == 1 and idle and last_run[0] <= _INLINE_MAX_SECONDS:
                        # A lone task while tasks run short: run it here,
                        # without a handoff to the pool (the next batch
                        # waits for it in gRPC's buffers meanwhile).
                        run(tasks[0])
                        continue
                    for task in tasks:
                        try:
                            self._pool.submit(run, task)
                        except RuntimeError:  # the pool is shut down: the plugin is stopping
                            out.put(pb.DecideResult(task_id=task.task_id, picked=-1, error="the plugin is stopping"))
            except grpc.RpcError:
                pass  # the stream ended (cancelled by the router)
            except Exception:  # noqa: BLE001
                self._log.exception("reading the decide stream")
            finally:
                out.put(_END)

        threading.Thread(target=receive, name="decide-receive", daemon=True).start()
        ended = False
        while not (ended and pending[0] == 0):
            results: List[pb.DecideResult] = []
            item = out.get()
            while True:
                if item is _END:
                    ended = True
                else:
                    results.append(_fit(item))
                try:
                    item = out.get_nowait()
                except queue.Empty:
                    break
            with lock:
                pending[0] -= len(results)
            for msg in _pack(results):
                yield msg

    def run_task(self, task: pb.DecideTask) -> pb.DecideResult:
        """Runs one task's stages like the router's pipeline; never raises."""
        res = pb.DecideResult(task_id=task.task_id, picked=-1)
        if task.deadline_unix_nano and time.time_ns() >= task.deadline_unix_nano:
            res.error = "deadline passed before the task ran"
            return res
        try:
            self._execute(task, res)
        except _TaskError as e:
            res = pb.DecideResult(task_id=task.task_id, picked=-1, error=str(e))
        except Exception as e:  # noqa: BLE001 - a task never takes the stream down
            log, count = self._internal_errors.note()
            if log:
                self._log.exception("decide task %d failed", task.task_id, extra={"failures": count})
            res = pb.DecideResult(task_id=task.task_id, picked=-1, error=f"internal error: {e}")
        return res

    def _execute(self, task: pb.DecideTask, res: pb.DecideResult) -> None:
        req = request_from_proto(task.request)
        c = candidates_from_proto(task.candidates)
        n = len(c)
        if n == 0:
            raise _TaskError("no workers")
        orig = list(range(n))  # orig[i] is the sent row of current row i
        total: Optional[List[float]] = list(c.costs) if c.costs is not None else None
        c.costs = total
        task_sum: Optional[List[float]] = None
        filtered = False
        stages = task.stages
        for si, st in enumerate(stages):
            inst = self._lookup(st.instance)
            if inst is None:
                raise _TaskError(f"unknown instance {quote(st.instance)} (not configured)")
            if inst.kind == Kind.FILTER:
                filtered = True
                keep = self._results(inst, lambda: inst.comp.filter(req, c), len(c))
                rows = _kept_rows(inst, keep)
                orig = [orig[i] for i in rows]
                if task_sum is not None:
                    task_sum = [task_sum[i] for i in rows]
                _compact(c, rows)
                if not rows:
                    res.filtered_by = inst.name
                    return
            elif inst.kind == Kind.SCORER:
                costs = self._results(inst, lambda: inst.comp.score(req, c), len(c))
                if task_sum is None:
                    task_sum = [0.0] * len(c)
                if c.costs is None:
                    c.costs = [0.0] * len(c)
                w = st.weight
                for i, v in enumerate(costs):
                    if type(v) is not float:
                        v = _cost(inst, v, i)
                    s, tot = task_sum[i] + w * v, c.costs[i] + w * v
                    if not (math.isfinite(s) and math.isfinite(tot)):
                        if not math.isfinite(v):
                            raise _TaskError(f"scorer {inst.name} wrote non-finite cost {_go_float(v)} at row {i}")
                        raise _TaskError(
                            f"scorer {inst.name}: cost {_go_float(v)} at row {i} overflows the weighted sum ({_go_float(tot)})"
                        )
                    task_sum[i], c.costs[i] = s, tot
            elif inst.kind == Kind.PICKER:
                if si != len(stages) - 1:
                    raise _TaskError(f"picker {quote(inst.name)} is not the task's last stage")
                row = self._call(inst, lambda: inst.comp.pick(req, c))
                try:
                    if isinstance(row, bool):
                        raise TypeError("a bool")
                    row = operator.index(row)  # any integer, numpy's too; never a float
                except TypeError:
                    raise _TaskError(f"picker {quote(inst.name)}: returned {row!r}, not a row index") from None
                if not 0 <= row < len(c):
                    raise _TaskError(f"picker {quote(inst.name)}: row {row} out of range [0, {len(c)})")
                res.picked = orig[row]
            else:
                raise _TaskError(f"instance {quote(inst.name)} is a {inst.kind}, which Decide cannot run")
        if filtered:
            res.kept.extend(orig)
        if task_sum is not None:
            res.costs.extend(task_sum)

    def _call(self, inst: _Instance, call: Callable[[], object]) -> object:
        """Runs one component call: a ComponentError becomes `KIND "NAME":
        MESSAGE`; any other exception is logged with its traceback (an
        instance's first, then at most one every 10 s) and becomes the Go
        SDK's panic wording, `KIND "NAME" panicked: VALUE`."""
        try:
            return call()
        except ComponentError as e:
            raise _TaskError(f"{inst.kind} {quote(inst.name)}: {e}") from None
        except Exception as e:  # noqa: BLE001
            log, count = inst.exceptions.note()
            if log:
                self._log.error(
                    "component raised", exc_info=True, extra={"instance": inst.name, "kind": str(inst.kind), "panics": count}
                )
            raise _TaskError(f"{inst.kind} {quote(inst.name)} panicked: {type(e).__name__}: {e}") from None

    def _results(self, inst: _Instance, call: Callable[[], object], n: int) -> List[object]:
        """Runs a filter's or scorer's call (through :meth:`_call`) and reads
        its answer into a list of n entries: any iterable but a string,
        bytes, a mapping or a set; a generator is read in the call, so its
        exceptions are the component's, and never past entry n + 1. Raises
        _TaskError naming the component for anything else or another
        length."""
        what = "keep flags" if inst.kind == Kind.FILTER else "costs"

        def read() -> object:
            out = call()
            if out is None or isinstance(out, (str, bytes, bytearray, Mapping, Set)):
                return _NotEntries(out)
            try:
                size = len(out)  # type: ignore[arg-type]
            except TypeError:
                size = None
            if size is not None and size != n:
                return _WrongLength(size)
            try:
                it = iter(out)  # type: ignore[call-overload]
            except TypeError:
                return _NotEntries(out)
            return list(itertools.islice(it, n + 1))  # an endless generator stops here

        out = self._call(inst, read)
        if isinstance(out, _NotEntries):
            want = "bools" if inst.kind == Kind.FILTER else "numbers"
            raise _TaskError(f"{inst.kind} {quote(inst.name)}: returned {_show(out.value)}, not a sequence of {want}")
        if isinstance(out, _WrongLength):
            raise _TaskError(f"{inst.kind} {quote(inst.name)}: {out.size} {what} for {n} rows")
        assert isinstance(out, list)
        if len(out) != n:
            got = f"more than {n}" if len(out) > n else str(len(out))
            raise _TaskError(f"{inst.kind} {quote(inst.name)}: {got} {what} for {n} rows")
        return out

    # --- Classify and Events ---------------------------------------------

    def _observe_clock(self, ns: int) -> None:
        with self._events_cond:
            self._clock = max(self._clock, ns)

    def _now(self) -> int:
        with self._events_cond:
            return self._clock or time.time_ns()

    def Classify(self, request, context):  # noqa: N802
        inst = self._lookup(request.instance)
        if inst is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown instance {quote(request.instance)} (not configured)")
        if inst.kind != Kind.CLASSIFIER:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"instance {quote(inst.name)} is a {inst.kind}, not a classifier")
        if request.now_unix_nano:
            self._observe_clock(request.now_unix_nano)
        if not self._wait_events(request.events_through, context):
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"lifecycle events through #{request.events_through} not delivered: context deadline exceeded",
            )
        req = request_from_proto(request.request)
        try:
            part = self._partition(inst, req)
            if request.has_workers:
                with inst.lock:  # concurrent calls may carry versions out of order: keep the newest
                    if request.workers_version >= part.version:
                        part.version = request.workers_version
                        part.workers = tuple(
                            WorkerInfo(id=w.id, dp_rank=w.dp_rank, total_kv_blocks=w.total_kv_blocks)
                            for w in request.workers
                        )
            return _classification_to_proto(self._classify(inst, part.classifier, req))
        except _TaskError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))

    def _wait_events(self, seq: int, context) -> bool:
        """Waits until every event through seq is delivered; False when the
        call's deadline passes (or the call ends) first."""
        with self._events_cond:
            while self._delivered < seq:
                left = context.time_remaining()
                if (left is not None and left <= 0) or not context.is_active():
                    return False
                self._events_cond.wait(1.0 if left is None else min(left, 1.0))
        return True

    def _partition(self, inst: _Instance, req: Request) -> _Partition:
        key = (req.model, req.role)
        with inst.lock:
            part = inst.partitions.setdefault(key, _Partition())
        with part.lock:  # the classifier is made outside the instance's lock
            if part.classifier is None:
                pc = PartitionContext(
                    model=req.model,
                    role=req.role,
                    block_size=req.block_size or inst.block_size,
                    workers=lambda: part.workers,
                    now_unix_nano=self._now,
                )
                try:
                    c = inst.comp.new_classifier(pc)
                    if c is None:
                        raise ValueError("new_classifier returned None")
                except Exception as e:  # noqa: BLE001
                    with inst.lock:
                        if inst.partitions.get(key) is part:
                            del inst.partitions[key]  # the next request tries again
                    self._log.error("new_classifier failed", exc_info=True, extra={"instance": inst.name})
                    raise _TaskError(
                        f"classifier {inst.name}: creating the classifier of model {quote(req.model)}, role {quote(req.role)}: {e}"
                    ) from None
                part.classifier = c
        return part

    def _classify(self, inst: _Instance, c: object, req: Request) -> Classification:
        try:
            cl = c.classify(req)
        except ComponentError as e:
            raise _TaskError(f"classifier {inst.name}: request {quote(req.id)}: {e}") from None
        except Exception as e:  # noqa: BLE001
            self._log.error("classifier raised", exc_info=True, extra={"instance": inst.name, "request": req.id})
            raise _TaskError(f"classifier {inst.name}: request {quote(req.id)}: panic: {type(e).__name__}: {e}") from None
        if not isinstance(cl, Classification):
            raise _TaskError(f"classifier {inst.name}: request {quote(req.id)}: returned {type(cl).__name__}, not a Classification")
        if cl.scheduling_cost_tokens < 0:
            raise _TaskError(
                f"classifier {inst.name}: request {quote(req.id)}: scheduling cost {cl.scheduling_cost_tokens} tokens is negative"
            )
        if cl.target is not None and not 0 <= cl.target <= _UINT64_MAX:
            raise _TaskError(f"classifier {inst.name}: request {quote(req.id)}: target {cl.target} is not a worker id")
        return cl

    def _listeners(self, inst: _Instance) -> List[object]:
        out = []
        if callable(getattr(inst.comp, "on_events", None)):
            out.append(inst.comp)
        with inst.lock:
            parts = list(inst.partitions.values())
        for p in parts:
            c = p.classifier
            if c is not None and c is not inst.comp and callable(getattr(c, "on_events", None)):
                out.append(c)
        return out

    def Events(self, request_iterator, context) -> Iterator[pb.EventAck]:  # noqa: N802
        """Delivers each batch to its instance's listeners, in order, then
        acknowledges it."""
        for b in request_iterator:
            inst = self._lookup(b.instance)
            if inst is not None and len(b.events) > 0:
                evs = [event_from_proto(e) for e in b.events]
                for listener in self._listeners(inst):
                    try:
                        listener.on_events(evs)
                    except Exception:  # noqa: BLE001 - the batch is still acknowledged
                        self._log.error("event listener raised", exc_info=True, extra={"instance": inst.name})
            if b.through_seq:
                with self._events_cond:
                    if b.through_seq > self._delivered:
                        self._delivered = b.through_seq
                        self._events_cond.notify_all()
            yield pb.EventAck(batch_id=b.batch_id)


# --- conversions -------------------------------------------------------------


def request_from_proto(p: pb.Request) -> Request:
    """Converts a wire Request; ids and hashes stay exact Python ints."""
    return Request(
        id=p.id,
        model=p.model,
        role=p.role,
        prompt_tokens=p.prompt_tokens,
        block_size=p.block_size,
        block_hashes=p.block_hashes,
        session_id=p.session_id,
        priority=p.priority,
        metadata=dict(p.metadata),
        cached_prompt_tokens=p.cached_prompt_tokens,
    )


_COLUMNS = (
    "dp_ranks",
    "active_requests",
    "load_available",
    "load_active_prefill_tokens",
    "load_active_decode_blocks",
    "load_active_requests",
    "load_kv_usage",
    "load_waiting",
    "overlap_blocks",
    "total_kv_blocks",
    "costs",
    "names",
)
_LOAD_COLUMNS = _COLUMNS[2:8]


def candidates_from_proto(cols: pb.Columns) -> Candidates:
    """Converts the wire columns; raises _TaskError when a non-empty column
    does not have one entry per row, or the load columns do not travel
    together."""
    n = len(cols.ids)
    c = Candidates(ids=list(cols.ids))
    for name in _COLUMNS:
        col = getattr(cols, name)
        if len(col) == 0:
            continue
        if len(col) != n:
            raise _TaskError(f"column {name} has {len(col)} entries for {n} rows")
        setattr(c, name, list(col))
    loads = [len(getattr(cols, name)) for name in _LOAD_COLUMNS]
    if any(loads) and not all(loads):
        raise _TaskError(f"load columns have {loads} entries for {n} rows; all six travel together")
    c.labels = _labels_from_proto(cols, n)
    return c


def _labels_from_proto(cols: pb.Columns, n: int) -> Optional[List[Mapping[str, str]]]:
    """Row i's labels are the next label_counts[i] (key, value) pairs of
    label_refs, indices into label_strings; None when the columns carry
    none. Raises _TaskError when they do not add up."""
    counts, refs, strs = cols.label_counts, cols.label_refs, cols.label_strings
    if len(counts) == 0:
        if len(refs):
            raise _TaskError(f"label_refs has {len(refs)} entries without label_counts")
        return None
    if len(counts) != n:
        raise _TaskError(f"column label_counts has {len(counts)} entries for {n} rows")
    if len(refs) % 2:
        raise _TaskError(f"label_refs has {len(refs)} entries, not a key and a value for each label")
    if sum(counts) != len(refs) // 2:
        raise _TaskError(f"label_counts add up to {sum(counts)} labels, label_refs has {len(refs) // 2}")
    if refs and max(refs) >= len(strs):
        raise _TaskError(f"label_refs refers to string {max(refs)} of {len(strs)} label_strings")
    out: List[Mapping[str, str]] = []
    off = 0
    for k in counts:
        out.append(MappingProxyType({strs[refs[off + 2 * j]]: strs[refs[off + 2 * j + 1]] for j in range(k)}))
        off += 2 * k
    return out


def _compact(c: Candidates, rows: Sequence[int]) -> None:
    """Keeps the given rows, in order, in every column that is set."""
    c.ids = [c.ids[i] for i in rows]
    for name in _COLUMNS + ("labels",):
        col = getattr(c, name)
        if col is not None:
            setattr(c, name, [col[i] for i in rows])


def event_from_proto(p: pb.Event) -> Event:
    """Converts one wire event."""
    try:
        kind = EventKind(p.kind)
    except ValueError:  # a kind newer than this SDK: passed on as its number
        kind = p.kind
    return Event(
        kind=kind,
        request_id=p.request_id,
        worker=p.worker if p.has_worker else None,
        context_tokens=p.context_tokens,
        reason=p.reason,
        unix_nano=p.unix_nano,
    )


def _classification_to_proto(c: Classification) -> pb.ClassifyResponse:
    r = pb.ClassifyResponse(
        priority=min(max(int(c.priority), _INT32_MIN), _INT32_MAX),
        policy_class=c.policy_class,
        due_unix_nano=int(c.due_unix_nano),
        scheduling_cost_tokens=int(c.scheduling_cost_tokens),
    )
    if c.target is not None:
        r.target, r.has_target = int(c.target), True
    return r


#: Every input bit this SDK knows (docs/plugin-protocol.md, "Inputs").
_KNOWN_INPUTS = int(functools.reduce(operator.or_, Inputs))


def _instance_inputs(got: object, t: TypeInfo) -> int:
    """Checks what an instance's inputs() returned: an Inputs (or int) of
    known bits, a subset of its type's declared inputs. Raises ValueError
    saying what is wrong (`returned ..., not ...`)."""
    if isinstance(got, bool) or not isinstance(got, int):
        raise ValueError(f"returned {_show(got)}, not an Inputs value")
    if got & ~_KNOWN_INPUTS:
        raise ValueError(f"returned {_show(got)}, which has bits outside the known inputs ({_inputs_names(_KNOWN_INPUTS)})")
    if got & ~int(t.inputs):
        raise ValueError(
            f"returned {_inputs_names(got)}, not a subset of the type's declared inputs ({_inputs_names(t.inputs)})"
        )
    return int(got)


def _inputs_names(v: int) -> str:
    """Names the bits of an Inputs value: `LOAD|CACHE (12)`, `NONE (0)`."""
    names = "|".join(f.name or "" for f in Inputs if f and v & f) or "NONE"
    return f"{names} ({int(v)})"


class _NotEntries:
    """A filter's or scorer's answer that is not a sequence of entries."""

    def __init__(self, value: object) -> None:
        self.value = value


class _WrongLength:
    """A filter's or scorer's answer of another length than the rows'."""

    def __init__(self, size: int) -> None:
        self.size = size


def _kept_rows(inst: _Instance, keep: Sequence[object]) -> List[int]:
    """The rows a filter keeps; raises _TaskError for an entry that is not a
    bool (1, "False" and NaN are refused, not read as truthy)."""
    rows = []
    for i, k in enumerate(keep):
        if k is True:
            rows.append(i)
        elif k is not False:
            raise _TaskError(f"filter {quote(inst.name)}: keep flag {_show(k)} at row {i} is not a bool")
    return rows


def _cost(inst: _Instance, v: object, i: int) -> float:
    """Converts a scorer's cost that is not a float: any real number (int,
    numpy's numbers, Fraction) but a bool; raises _TaskError for anything
    else or an int beyond a float's range. Finiteness is checked later."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise _TaskError(f"scorer {quote(inst.name)}: cost {_show(v)} at row {i} is not a number (int or float)")
    try:
        return float(v)
    except OverflowError:
        raise _TaskError(f"scorer {quote(inst.name)}: cost {_show(v)} at row {i} is too large for a float") from None


def _show(v: object, limit: int = 60) -> str:
    """repr(v) cut to about limit characters, for an error message: a
    component's answer can be anything (an int of 400 digits, an object whose
    repr raises)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an int of {v.bit_length()} bits"
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 - any repr may raise
        r = f"<{type(v).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _go_float(v: float) -> str:
    """Formats v as Go's %v does for the non-finite values: NaN, +Inf, -Inf."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _fit(r: pb.DecideResult) -> pb.DecideResult:
    """Replaces a result over the message-size limit with the error the
    router recognises (`result of N bytes exceeds the 67108864-byte limit`)."""
    bound = 64 + len(r.error) * 4 + len(r.filtered_by) * 4 + 5 * len(r.kept) + 8 * len(r.costs)
    if bound < MAX_MESSAGE_BYTES // 2:
        return r
    size = r.ByteSize()
    if size + _RESULT_OVERHEAD > MAX_MESSAGE_BYTES:
        return pb.DecideResult(
            task_id=r.task_id, picked=-1, error=f"result of {size} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit"
        )
    return r


def _pack(results: Sequence[pb.DecideResult], limit: int = MAX_MESSAGE_BYTES) -> Iterator[pb.DecideResults]:
    """Groups results into DecideResults messages of at most limit bytes."""
    batch: List[pb.DecideResult] = []
    size = 0
    for r in results:
        s = r.ByteSize() + _RESULT_OVERHEAD
        if batch and size + s > limit:
            yield pb.DecideResults(results=batch)
            batch, size = [], 0
        batch.append(r)
        size += s
    if batch:
        yield pb.DecideResults(results=batch)


def _diagnostics(err: BaseException, log: logging.Logger, type_name: str, instance: str) -> List[Tuple[str, str, str]]:
    """Turns a constructor's exception into diagnostics: every ParamError in
    an ExceptionGroup tree names its parameter; anything else is one
    diagnostic for the whole block."""
    out: List[Tuple[str, str, str]] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, ParamError):
            out.append((e.param, str(e), ""))
        elif isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            if not isinstance(e, (ValueError, ComponentError)):
                log.error("constructor raised", exc_info=e, extra={"type": type_name, "instance": instance})
            out.append(("", str(e) or type(e).__name__, ""))

    walk(err)
    return out
