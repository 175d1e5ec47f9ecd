"""The log format the router reads (docs/plugin-protocol.md section 7)."""

import io
import json
import logging
import os
import unittest
from unittest import mock

from switchyard_plugin import log as sylog


class LogTest(unittest.TestCase):
    def record(self, level, msg, exc=None, **extra):
        logger = logging.Logger("my-plugin", level=1)
        out = io.StringIO()
        h = logging.StreamHandler(out)
        h.setFormatter(sylog.JSONFormatter())
        logger.addHandler(h)
        logger.log(level, msg, exc_info=exc, extra=extra)
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 1, lines)
        return json.loads(lines[0])

    def test_levels_keep_their_name(self):
        for level, want in [(sylog.TRACE, "trace"), (logging.DEBUG, "debug"), (logging.INFO, "info"),
                            (logging.WARNING, "warn"), (logging.ERROR, "error"), (logging.CRITICAL, "error")]:
            self.assertEqual(self.record(level, "x")["@level"], want)

    def test_fields(self):
        e = self.record(logging.WARNING, "model not known", model="llama-70b", worker=(1 << 64) - 1)
        self.assertEqual({k: v for k, v in e.items() if k != "@timestamp"},
                         {"@level": "warn", "@message": "model not known", "@module": "my-plugin",
                          "model": "llama-70b", "worker": (1 << 64) - 1})
        try:
            raise KeyError("k")
        except KeyError as err:
            e = self.record(logging.ERROR, "failed\nbadly", exc=err)
        self.assertEqual((e["@message"], e["error"]), ("failed\nbadly", "'k'"))
        self.assertIn("Traceback (most recent call last)", e["stack"])

    def test_level_from_env(self):
        for value, want in [("trace", sylog.TRACE), ("WARN", logging.WARNING), ("error", logging.ERROR),
                            ("", logging.INFO), ("loud", logging.INFO)]:
            with mock.patch.dict(os.environ, {sylog.LOG_LEVEL_ENV: value}):
                self.assertEqual(sylog.level_from_env(), want, value)


if __name__ == "__main__":
    unittest.main()
