"""serve(): the plugin process's side of docs/plugin-protocol.md sections 1, 2 and 6."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn, Optional, Sequence

import grpc

from . import log as _log
from .server import API_VERSION, GRPC_OPTIONS, PluginServer, validate_types
from .types import TypeInfo

#: The magic cookie's variable and value: they tell a binary the router
#: started it. Not a secret.
COOKIE_KEY = "SWITCHYARD_PLUGIN"
COOKIE_VALUE = "02131c040c44fb6342fb990f8fd29af6a7da02727dd67a7a8ec8c87382e54d8a"

#: How often the parent pid is checked, seconds.
PARENT_POLL_SECONDS = 0.25

# How long a stop lets calls in flight finish, seconds: the router SIGKILLs
# the group 500 ms after it asks.
_STOP_GRACE_SECONDS = 0.3


def serve(
    version: str,
    types: Sequence[TypeInfo],
    *,
    logger: Optional[logging.Logger] = None,
    decide_workers: int = 4,
    max_rpc_threads: int = 32,
    expected_decide_p99: float = 0.0,
) -> NoReturn:
    """Serves ``types`` to the router and exits the process when the router
    ends the plugin; it never returns.

    It checks the magic cookie (without it: a message on stderr, exit 1),
    listens on a Unix socket in ``PLUGIN_UNIX_SOCKET_DIR``, writes the
    handshake line to stdout, then points ``sys.stdout`` at stderr (the
    router discards stdout after the handshake; a stray ``print`` is logged
    instead). Logs go to stderr as JSON lines (see :mod:`switchyard_plugin.log`)
    unless ``logger`` is given or the root logger already has handlers.
    Invalid types are logged and exit 1.

    ``decide_workers`` threads run Decide tasks; ``max_rpc_threads`` bounds
    the gRPC server's threads (each open stream holds one).

    ``expected_decide_p99``, seconds (0: not declared), is the p99 time the
    plugin expects one Decide task to take under load, sent in Describe
    (``expected_decide_p99_nanos``): the router logs a warning at start when
    the plugin block's ``call_timeout`` is below it, and ``router plugins
    check`` warns too (docs/plugin-protocol.md, "Deadlines by language").

    It exits 0 after ``plugin.GRPCController/Shutdown``. When the router dies
    (SIGTERM, or the parent pid changes, checked every 250 ms), it removes
    its socket directory (only a directory named ``sy-*`` holding only
    sockets), then SIGKILLs its own process group when it leads it, so any
    process it started goes too, or exits 1.
    """
    setup_log = _log.setup()
    log = logger or setup_log
    try:
        validate_types(types)
    except ValueError as e:
        log.error("invalid plugin types", extra={"error": str(e)})
        sys.exit(1)
    if os.environ.get(COOKIE_KEY) != COOKIE_VALUE:
        sys.stderr.write(
            "This binary is a Switchyard plugin. It is not meant to be run directly: "
            "a policy file's plugin block makes the router start it.\n"
        )
        sys.exit(1)
    sock_dir = os.environ.get("PLUGIN_UNIX_SOCKET_DIR", "")
    stop = threading.Event()
    ps = PluginServer(
        version,
        types,
        log=log,
        decide_workers=decide_workers,
        on_shutdown=stop.set,
        expected_decide_p99=expected_decide_p99,
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=max_rpc_threads, thread_name_prefix="grpc"), options=GRPC_OPTIONS)
    ps.add_to(server)
    path = os.path.join(sock_dir or tempfile.gettempdir(), f"plugin{secrets.randbelow(10**10)}")
    if server.add_insecure_port("unix:" + path) == 0:
        log.error("cannot listen", extra={"socket": path})
        sys.exit(1)
    server.start()

    ppid = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: abandon(log, sock_dir, "SIGTERM (the router died, or an operator asked)"))
    # API version 1 is the only one this SDK speaks: it is announced whatever
    # PLUGIN_PROTOCOL_VERSIONS offers (a router without it refuses it clearly).
    sys.stdout.write(handshake_line(API_VERSION, path))
    sys.stdout.flush()
    sys.stdout = sys.stderr
    # The main thread waits here, so signals are handled promptly, and
    # watches the parent pid.
    while not stop.wait(PARENT_POLL_SECONDS):
        if os.getppid() != ppid:
            abandon(log, sock_dir, f"the parent process {ppid} exited (new parent {os.getppid()})")
    log.debug("stopping: the router asked")
    server.stop(_STOP_GRACE_SECONDS).wait()
    ps.close()
    logging.shutdown()
    os._exit(0)


def handshake_line(app_version: int, socket_path: str) -> str:
    """go-plugin's handshake line: core version 1, the API version, the
    network, the address, and the protocol, gRPC."""
    return f"1|{app_version}|unix|{socket_path}|grpc\n"


def abandon(log: logging.Logger, sock_dir: str, why: str) -> NoReturn:
    """Ends the plugin without its router: removes the socket directory, then
    SIGKILLs the plugin's process group (itself included) when it leads it,
    or exits 1. Logging may fail now (the router's end of stderr is probably
    closed): Python ignores SIGPIPE, and the handler drops what it cannot
    write."""
    logging.raiseExceptions = False
    err = remove_socket_dir(sock_dir)
    log.error("stopping without the router; killing the process group", extra={"reason": why})
    if err is not None:
        log.warning("socket directory left behind", extra={"dir": sock_dir, "error": err})
    pid = os.getpid()
    if os.getpgrp() == pid:
        os.killpg(pid, signal.SIGKILL)
    os._exit(1)


def remove_socket_dir(d: str) -> Optional[str]:
    """Removes d when it looks like a socket directory the router made: a
    directory (not a link) named ``sy-*`` holding nothing but sockets.
    Anything else is left alone. Returns why it was left behind, or None."""
    if not d or not os.path.basename(d.rstrip("/")).startswith("sy-"):
        return None
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode):
            return None
        names = os.listdir(d)
        for name in names:
            if not stat.S_ISSOCK(os.lstat(os.path.join(d, name)).st_mode):
                return f"not removed: {name} is not a socket"
        for name in names:
            try:
                os.remove(os.path.join(d, name))
            except FileNotFoundError:
                pass
        os.rmdir(d)
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e)
    return None
