"""Logging in the format the router reads from a plugin's stderr.

One JSON object per line, hclog's JSON format (docs/plugin-protocol.md,
section 7): ``@level`` (trace, debug, info, warn, error) keeps the line's
level in the router's log, ``@message`` is the message, ``@module`` the
logger's name, ``@timestamp`` the time; every other key is a key-value pair
of the entry (pass them with ``extra={...}``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import traceback
from typing import IO, Optional

#: The environment variable naming the log level (trace, debug, info, warn,
#: error); info when unset or unknown. The plugin gets it only when the
#: policy's plugin block sets it in ``env`` (or passes it with ``pass_env``).
LOG_LEVEL_ENV = "SWITCHYARD_PLUGIN_LOG_LEVEL"

#: hclog's trace level, below logging.DEBUG.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# Attributes every LogRecord has; the others came from extra={...}.
_RECORD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def level_name(levelno: int) -> str:
    """The hclog level name of a logging level."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= logging.INFO:
        return "info"
    if levelno >= logging.DEBUG:
        return "debug"
    return "trace"


class JSONFormatter(logging.Formatter):
    """Formats a record as one hclog JSON line (no newline inside)."""

    def format(self, record: logging.LogRecord) -> str:
        d = {
            "@level": level_name(record.levelno),
            "@message": record.getMessage(),
            "@module": record.name,
            "@timestamp": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
        }
        for k, v in vars(record).items():
            if k not in _RECORD_ATTRS and not k.startswith("_"):
                d[k] = v
        if record.exc_info and record.exc_info[1] is not None:
            d["error"] = str(record.exc_info[1])
            d["stack"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(d, default=str, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):
    """A stream handler that drops lines it cannot write (the router's end of
    stderr closed) instead of printing a traceback about it."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802
        pass


def level_from_env() -> int:
    """The logging level LOG_LEVEL_ENV names; INFO by default."""
    return _LEVELS.get(os.environ.get(LOG_LEVEL_ENV, "").strip().lower(), logging.INFO)


def setup(stream: Optional[IO[str]] = None) -> logging.Logger:
    """Sends the root logger's records as JSON lines to stream (stderr) at
    the level LOG_LEVEL_ENV names, unless the root logger has handlers
    already, and logs uncaught exceptions (main thread and others) at error
    level. Returns the SDK's logger, "switchyard_plugin"."""
    root = logging.getLogger()
    if not root.handlers:
        h = _StderrHandler(stream or sys.stderr)
        h.setFormatter(JSONFormatter())
        root.addHandler(h)
        root.setLevel(level_from_env())
    log = logging.getLogger("switchyard_plugin")

    def excepthook(tp, value, tb) -> None:
        log.error("uncaught exception", exc_info=(tp, value, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            log.error(
                "uncaught exception in a thread",
                exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
                extra={"thread_name": getattr(args.thread, "name", "")},
            )

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    return log
