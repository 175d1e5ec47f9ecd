"""switchyard_plugin: write Switchyard plugins (filters, scorers, pickers,
classifiers) in Python.

A plugin declares its component types (:class:`TypeInfo`, with a parameter
schema of :class:`ParamSpec`) and calls :func:`serve`, which speaks the
protocol of docs/plugin-protocol.md (API version 1) to the router: the
handshake, Describe, Configure, batched Decide, Classify, Events, health,
shutdown, parent death and the log format. See sdk/python/README.md.
"""

from .log import LOG_LEVEL_ENV, TRACE, JSONFormatter
from .log import setup as setup_logging
from .process import COOKIE_KEY, COOKIE_VALUE, serve
from .server import API_VERSION, MAX_MESSAGE_BYTES, PluginServer
from .types import (
    Candidates,
    Classification,
    Classifier,
    ClassifierFactory,
    ComponentError,
    Event,
    EventKind,
    EventListener,
    Filter,
    Inputs,
    InstanceInfo,
    Kind,
    ParamError,
    Params,
    ParamSpec,
    ParamType,
    ParamValue,
    PartitionContext,
    Picker,
    Request,
    Scorer,
    TypeInfo,
    WorkerInfo,
    non_negative,
    worker_id_of,
)

__all__ = [
    "API_VERSION",
    "COOKIE_KEY",
    "COOKIE_VALUE",
    "LOG_LEVEL_ENV",
    "MAX_MESSAGE_BYTES",
    "TRACE",
    "Candidates",
    "Classification",
    "Classifier",
    "ClassifierFactory",
    "ComponentError",
    "Event",
    "EventKind",
    "EventListener",
    "Filter",
    "Inputs",
    "InstanceInfo",
    "JSONFormatter",
    "Kind",
    "ParamError",
    "ParamSpec",
    "ParamType",
    "ParamValue",
    "Params",
    "PartitionContext",
    "Picker",
    "PluginServer",
    "Request",
    "Scorer",
    "TypeInfo",
    "WorkerInfo",
    "non_negative",
    "serve",
    "worker_id_of",
    "setup_logging",
]
