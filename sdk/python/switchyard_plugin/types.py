"""The SDK's types: what a plugin author declares and what components see.

They mirror the Go SDK (package ``shared``) and the wire types of
``switchyard.plugin.v1`` (docs/plugin-protocol.md, section 8), in Python
terms: columns are sequences, a refused parameter is a raised
:class:`ParamError`, and a component's failure is a raised
:class:`ComponentError`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable


class Kind(enum.IntEnum):
    """A component type's role in a policy; the numbering is the wire's ``Kind``."""

    FILTER = 1
    SCORER = 2
    PICKER = 3
    CLASSIFIER = 4

    def __str__(self) -> str:
        return self.name.lower()


class ParamType(enum.IntEnum):
    """The type of one parameter; the numbering is the wire's ``ParamType``.

    Values reach a component's constructor as ``float`` (NUMBER), ``int``
    (INT, 64-bit), ``bool`` (BOOL), ``str`` (STRING), ``int`` nanoseconds
    (DURATION), a tuple of ``str`` (STRING_LIST, written ``["a", "b"]`` in
    the policy file) or a tuple of finite ``float`` (NUMBER_LIST).
    """

    NUMBER = 1
    INT = 2
    BOOL = 3
    STRING = 4
    DURATION = 5
    STRING_LIST = 6
    NUMBER_LIST = 7

    def __str__(self) -> str:
        # The schema names the Go SDK and the router print.
        return {6: "list(string)", 7: "list(number)"}.get(self.value, self.name.lower())


class Inputs(enum.IntFlag):
    """The candidate columns a component reads (docs/plugin-protocol.md, "Inputs").

    The router computes only the inputs some component of a policy declared,
    so declare everything you read.
    """

    NONE = 0
    #: ``Candidates.active_requests``: the router's in-flight requests per worker.
    ACTIVE_REQUESTS = 1
    #: Deprecated alias of ACTIVE_REQUESTS.
    OCCUPANCY = 2
    #: The six ``Candidates.load_*`` columns.
    LOAD = 4
    #: ``Candidates.overlap_blocks``: prefix blocks of the request each worker holds.
    CACHE = 8
    #: ``Candidates.total_kv_blocks``: each worker's KV capacity in blocks (0: unknown).
    CAPACITY = 16
    #: ``Candidates.names`` and ``Candidates.labels``: each worker's name and labels.
    LABELS = 32


#: A parameter value: float, int (also durations, in nanoseconds), bool,
#: str, or a tuple of str (STRING_LIST) or of float (NUMBER_LIST).
ParamValue = Union[float, int, bool, str, Tuple[str, ...], Tuple[float, ...]]
#: Decoded parameters by name, defaults filled in; absent optional
#: parameters without a default are missing.
Params = Mapping[str, ParamValue]


class ParamError(ValueError):
    """A parameter a type's constructor refuses.

    Raise it from :attr:`TypeInfo.new`; the router reports it at the
    parameter's file:line:col. Several at once: raise an ``ExceptionGroup``
    of them. Any other exception refuses the whole block.
    """

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f'parameter "{param}": {reason}')
        self.param = param
        self.reason = reason


class ComponentError(Exception):
    """A component's expected failure for one call (the Go SDK's returned error).

    The task is answered with ``KIND "NAME": MESSAGE`` and the policy's
    fallback decides. Any other exception is treated like a Go panic: it is
    logged with its traceback and answered ``KIND "NAME" panicked: ...``.
    """


def worker_id_of(name: str) -> int:
    """The worker id of the worker named ``name``, as the router gives it in
    serve, epp and replay: FNV-1a 64 of the name's UTF-8 bytes (offset basis
    14695981039346656037, prime 1099511628211, modulo 2**64)."""
    h = 14695981039346656037
    for b in name.encode("utf-8"):
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def non_negative(name: str, value: float) -> float:
    """Returns ``value`` when it is a finite number >= 0, else raises :class:`ParamError`."""
    if not math.isfinite(value) or value < 0:
        raise ParamError(name, f"must be a finite number >= 0, got {value}")
    return value


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a type's schema: what the router decodes the policy
    file's attribute against and ``router plugins describe`` prints.

    ``default`` must be of ``type`` (an int is accepted for a NUMBER; a
    DURATION is int nanoseconds; a list type takes a list or tuple); None
    means no default.
    """

    name: str
    type: ParamType
    doc: str
    default: Optional[ParamValue] = None
    required: bool = False


@dataclass(frozen=True)
class InstanceInfo:
    """Where an instance is being created (``ConfigureRequest``).

    ``name`` is ``ROLE/POLICY/BLOCK``; ``role`` is aggregated, prefill,
    decode, or "" for classifiers; ``block_size`` is the router's tokens per
    KV block.
    """

    name: str
    role: str
    block_size: int


@dataclass(frozen=True)
class TypeInfo:
    """One component type a plugin serves.

    ``new(info, params)`` returns a fresh instance implementing the
    interface of ``kind`` (:class:`Filter`, :class:`Scorer`, :class:`Picker`
    or :class:`ClassifierFactory`); it raises :class:`ParamError` for a
    refused parameter. ``inputs`` are the inputs an instance may declare
    (each instance says its own through ``inputs()``, or gets these when it
    has no such method). ``events``: for a classifier type, its
    per-partition classifiers listen to lifecycle events although the
    factory does not.
    """

    name: str
    kind: Kind
    new: Callable[[InstanceInfo, Params], object]
    doc: str
    inputs: Inputs = Inputs.NONE
    params: Sequence[ParamSpec] = ()
    events: bool = False

    def param(self, name: str) -> Optional[ParamSpec]:
        """The spec of the named parameter, or None."""
        for p in self.params:
            if p.name == name:
                return p
        return None


@dataclass
class Request:
    """What a component sees of one LLM request (read-only).

    ``block_hashes`` are chained 64-bit hashes of the prompt's blocks of
    ``block_size`` tokens: entry k identifies tokens [0, (k+1)*block_size).
    """

    id: str
    model: str
    role: str
    prompt_tokens: int
    block_size: int
    block_hashes: Sequence[int]
    session_id: str
    priority: int
    metadata: Mapping[str, str]
    cached_prompt_tokens: int


@dataclass
class Candidates:
    """The candidate workers as columns: row i of every column that is not
    None describes worker ``ids[i]`` (an unsigned 64-bit int). Rows are in
    ascending (id, dp_rank) order.

    A column is None unless some component of the policy declared its input;
    a component must not read a column it did not declare. The six
    ``load_*`` columns are all set or all None; ``load_kv_usage`` is NaN and
    ``load_waiting`` -1 where the engine reported none. ``costs`` is the
    summed weighted cost of the scorers that ran before (a picker sees this
    task's scorers added), None when none did. Treat them as read-only.

    With the LABELS input, ``names[i]`` is row i's worker name
    (``worker_id_of(names[i]) == ids[i]`` for the router's workers) and
    ``labels[i]`` its labels, a mapping of str to str: the worker block's
    or pod's own plus the router's ``switchyard.io/role``,
    ``switchyard.io/model`` and ``switchyard.io/dp-rank``.
    """

    ids: Sequence[int]
    dp_ranks: Optional[Sequence[int]] = None
    active_requests: Optional[Sequence[int]] = None
    load_available: Optional[Sequence[bool]] = None
    load_active_prefill_tokens: Optional[Sequence[int]] = None
    load_active_decode_blocks: Optional[Sequence[int]] = None
    load_active_requests: Optional[Sequence[int]] = None
    load_kv_usage: Optional[Sequence[float]] = None
    load_waiting: Optional[Sequence[int]] = None
    overlap_blocks: Optional[Sequence[int]] = None
    total_kv_blocks: Optional[Sequence[int]] = None
    costs: Optional[Sequence[float]] = None
    names: Optional[Sequence[str]] = None
    labels: Optional[Sequence[Mapping[str, str]]] = None

    def __len__(self) -> int:
        return len(self.ids)


@runtime_checkable
class Filter(Protocol):
    """Keeps a subset of the candidates: returns one Python ``bool`` per row
    (a list, tuple or other iterable but a string), True to keep it; any
    other entry (1, "False", NaN, numpy's ``bool_``) fails the task."""

    def filter(self, req: Request, cands: Candidates) -> Sequence[bool]: ...


@runtime_checkable
class Scorer(Protocol):
    """Returns one finite, lower-is-better cost per row: ints or floats
    (any real number, numpy's too; never a bool or a str), as a list, tuple
    or other iterable but a string.

    The SDK multiplies them by the stage's weight; NaN or infinity fails the task.
    """

    def score(self, req: Request, cands: Candidates) -> Sequence[float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses one row of ``cands`` (never empty): returns its index."""

    def pick(self, req: Request, cands: Candidates) -> int: ...


@dataclass
class Classification:
    """What a classifier sets on a request; the defaults are a valid answer.

    ``priority`` orders requests in a queue class, higher first (int32
    range). ``policy_class`` is the queue class ("" the default).
    ``due_unix_nano``: when a request still queued is rejected (0: none).
    ``scheduling_cost_tokens``: its charge in the queue's weighted round
    robin (0: the router's default; negative is an error). ``target``: an
    advisory worker id, or None.
    """

    priority: int = 0
    policy_class: str = ""
    due_unix_nano: int = 0
    scheduling_cost_tokens: int = 0
    target: Optional[int] = None


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of a partition: ``id`` (unsigned 64-bit), ``dp_rank`` and
    ``total_kv_blocks`` (0: unknown)."""

    id: int
    dp_rank: int
    total_kv_blocks: int


@dataclass(frozen=True)
class PartitionContext:
    """What a classifier gets for its partition (one model and role).

    ``workers()`` returns the partition's workers as the router last sent
    them (empty before the first list). ``now_unix_nano()`` is the router's
    clock (simulated time in replay), the latest seen: use it rather than
    the machine's clock so replays repeat exactly.
    """

    model: str
    role: str
    block_size: int
    workers: Callable[[], Sequence[WorkerInfo]]
    now_unix_nano: Callable[[], int]


@runtime_checkable
class Classifier(Protocol):
    """Classifies the requests of one partition; called concurrently."""

    def classify(self, req: Request) -> Classification: ...


@runtime_checkable
class ClassifierFactory(Protocol):
    """What a classifier type's ``new`` returns: one classifier per partition."""

    def new_classifier(self, pc: PartitionContext) -> Classifier: ...


class EventKind(enum.IntEnum):
    """A request lifecycle event; the numbering is the wire's ``EventKind``."""

    SENT = 1
    FIRST_TOKEN = 2
    COMPLETED = 3
    ABORTED = 4


@dataclass(frozen=True)
class Event:
    """One lifecycle step of one request.

    ``worker`` is the worker id, or None when the request had not been sent;
    ``context_tokens`` is set on COMPLETED, ``reason`` on ABORTED;
    ``unix_nano`` is the router's clock (0 if unknown).
    """

    kind: EventKind
    request_id: str
    worker: Optional[int] = None
    context_tokens: int = 0
    reason: str = ""
    unix_nano: int = 0


@runtime_checkable
class EventListener(Protocol):
    """Optional for any component or per-partition classifier: hears the
    lifecycle of requests, in order, from one thread at a time. It must
    ignore requests it does not know."""

    def on_events(self, events: Sequence[Event]) -> None: ...


#: The interface an instance of each kind must implement.
KIND_INTERFACES: Mapping[Kind, type] = {
    Kind.FILTER: Filter,
    Kind.SCORER: Scorer,
    Kind.PICKER: Picker,
    Kind.CLASSIFIER: ClassifierFactory,
}

