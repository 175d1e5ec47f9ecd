#!/usr/bin/python3
"""A test plugin that starts a helper process (sleep) and logs its pid, so
tests can check that nothing of a plugin outlives its router."""

import logging
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import switchyard_plugin as sp  # noqa: E402


class ZeroScorer:
    def score(self, req, cands):
        return [0.0] * len(cands)


if __name__ == "__main__":
    if os.environ.get(sp.COOKIE_KEY) == sp.COOKIE_VALUE:
        child = subprocess.Popen(["/bin/sleep", "600"])
        print(f"child {child.pid}", file=sys.stderr, flush=True)
    sp.setup_logging()  # before serve(), so this line is JSON too
    logging.getLogger("child-plugin").info("a log line", extra={"answer": 42})
    sp.serve("0.0.1", [sp.TypeInfo(name="zero", kind=sp.Kind.SCORER, doc="Zero.",
                                   new=lambda i, p: ZeroScorer())])
