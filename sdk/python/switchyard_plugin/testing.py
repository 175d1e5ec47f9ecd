"""Run ``router plugins check`` on a plugin from a test.

:func:`check` runs the router's own conformance checks (the same as
``router plugins check``, docs/plugin-protocol.md section 9: the decide
checks through the router's own pipeline, latency under load, and with
``replay`` a short replay with ``--fail-on-fallback``'s rule) on a plugin
script, and returns a :class:`Report`. Use it from unittest or pytest::

    from switchyard_plugin import testing

    class Conformance(unittest.TestCase):
        def test_check(self):
            testing.check("my_plugin.py", replay=True).assert_passed()

    def test_check():  # pytest
        testing.check("my_plugin.py").assert_passed()

:meth:`Report.assert_passed` raises ``AssertionError`` listing every failed
check (``FAIL name: expected X, got Y``), which both frameworks report as a
test failure. The router is the executable ``router`` argument names, else
the environment variable ``SWITCHYARD_ROUTER``, else ``router`` on ``PATH``;
:class:`RouterNotFound` (an ``AssertionError`` too) says which were tried.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Union

#: The environment variable naming the router executable.
ROUTER_ENV = "SWITCHYARD_ROUTER"

# A Python plugin's start (importing grpc and protobuf) takes seconds on a
# busy machine: the check gives it a minute, as cmd/router's tests do.
_START_TIMEOUT = "1m"

# The whole run's bound, seconds: the checks, a replay, and parent death.
_RUN_TIMEOUT = 600


class RouterNotFound(AssertionError):
    """No router executable was found to run the checks with."""


@dataclass
class Check:
    """One check's result, as ``router plugins check --json`` gives it."""

    name: str
    passed: bool
    skipped: bool = False
    expected: str = ""
    got: str = ""
    note: str = ""
    warning: str = ""

    def line(self) -> str:
        """The check as ``router plugins check`` prints it."""
        if self.skipped:
            return f"SKIP {self.name}: {self.note}"
        if not self.passed:
            return f"FAIL {self.name}: expected {self.expected}, got {self.got}"
        return f"PASS {self.name}" + (f" ({self.note})" if self.note else "")


@dataclass
class Report:
    """What :func:`check` found: every check, in order, and the router's
    error when the checks could not run (a usage error)."""

    checks: List[Check] = field(default_factory=list)
    error: str = ""
    exit_code: int = 0
    stderr: str = ""

    @property
    def failed(self) -> List[Check]:
        """The failed checks (a skipped one did not fail)."""
        return [c for c in self.checks if not c.passed and not c.skipped]

    @property
    def warnings(self) -> List[Check]:
        """The passed checks with a warning (latency over call_timeout)."""
        return [c for c in self.checks if c.passed and c.warning]

    def by_name(self, name: str) -> Optional[Check]:
        """The first check of that name, or None."""
        return next((c for c in self.checks if c.name == name), None)

    def assert_passed(self) -> None:
        """Raises AssertionError, listing the failures, unless every check
        passed (or was skipped) and the router ran them."""
        if self.error:
            raise AssertionError(f"router plugins check could not run: {self.error}\n{self.stderr}")
        if self.failed or not self.checks:
            lines = "\n".join(c.line() for c in self.failed) or "no check ran"
            raise AssertionError(f"router plugins check failed (exit {self.exit_code}):\n{lines}")


def find_router(router: Optional[str] = None) -> str:
    """The router executable: ``router``, else $SWITCHYARD_ROUTER, else
    ``router`` on PATH; RouterNotFound otherwise."""
    for candidate in (router, os.environ.get(ROUTER_ENV)):
        if candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
            raise RouterNotFound(f"router executable {candidate!r} does not exist or is not executable")
    found = shutil.which("router")
    if found:
        return found
    raise RouterNotFound(f"no router executable: pass router=..., set {ROUTER_ENV}, or put router on PATH (go build ./cmd/router)")


def check(
    script: Union[str, Sequence[str]],
    *,
    router: Optional[str] = None,
    config: Optional[Mapping[str, object]] = None,
    type: Optional[str] = None,  # noqa: A002 - the flag's name
    call_timeout: Optional[str] = None,
    replay: Union[bool, str] = False,
    replay_limit: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    interpreter: Optional[str] = None,
    timeout: float = _RUN_TIMEOUT,
) -> Report:
    """Runs ``router plugins check --json`` on a plugin and returns its
    report.

    ``script`` is a Python script (run by ``interpreter``, default this
    interpreter, ``sys.executable``), or a command list run as is. The
    plugin's environment is ``env`` plus PYTHONPATH naming this SDK (the
    router passes nothing else). ``config`` are parameter values
    (``--config NAME=VALUE``), ``type`` checks one type, ``call_timeout``
    (a Go duration such as ``"20ms"``) is what latency is compared with,
    ``replay`` (True: the bundled trace; or a trace file) adds the replay
    check, of ``replay_limit`` requests.
    """
    exe = find_router(router)
    args = [exe, "plugins", "check", "--json", "--start-timeout", _START_TIMEOUT]
    sdk = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plugin_env: Dict[str, str] = {"PYTHONPATH": sdk}
    plugin_env.update(env or {})
    for k, v in sorted(plugin_env.items()):
        args += ["--env", f"{k}={v}"]
    for k, v in sorted((config or {}).items()):
        if isinstance(v, bool):
            v = "true" if v else "false"
        args += ["--config", f"{k}={v}"]
    if type is not None:
        args += ["--type", type]
    if call_timeout is not None:
        args += ["--call-timeout", call_timeout]
    if replay:
        args += ["--replay=" + ("default" if replay is True else str(replay))]
        if replay_limit is not None:
            args += ["--replay-limit", str(replay_limit)]
    if isinstance(script, str):
        command = [interpreter or sys.executable, os.path.abspath(script)]
    else:
        command = list(script)
    args += ["--"] + command
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    try:
        doc = json.loads(proc.stdout)
    except ValueError as e:
        raise AssertionError(
            f"router plugins check (exit {proc.returncode}) printed no JSON report: {e}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        ) from None
    checks = [
        Check(
            name=c.get("name", ""),
            passed=bool(c.get("pass")),
            skipped=bool(c.get("skipped")),
            expected=c.get("expected", ""),
            got=c.get("got", ""),
            note=c.get("note", ""),
            warning=c.get("warning", ""),
        )
        for c in doc.get("checks") or []
    ]
    return Report(checks=checks, error=doc.get("error", ""), exit_code=proc.returncode, stderr=proc.stderr)
