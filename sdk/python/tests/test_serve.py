"""serve() in a real plugin process: the handshake, the cookie, shutdown,
SIGTERM and parent death (docs/plugin-protocol.md sections 1, 2, 6 and 7)."""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import switchyard_plugin as sp
from switchyard_plugin._pb import grpc_controller_pb2, grpc_controller_pb2_grpc
from switchyard_plugin._pb import plugin_pb2 as pb
from switchyard_plugin._pb import plugin_pb2_grpc
from switchyard_plugin.process import remove_socket_dir

from .helpers import EXAMPLE, SDK_DIR, TIMEOUT

CHILD_PLUGIN = os.path.join(SDK_DIR, "tests", "child_plugin.py")


def alive(pid):
    """Whether pid is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def eventually(cond, what):
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {TIMEOUT} s: {what}")
        time.sleep(0.05)


class ServeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sdk-serve-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # The router's socket directory: a fresh sy-* directory.
        self.sock_dir = tempfile.mkdtemp(prefix="sy-", dir=self.tmp)
        self.stderr_path = os.path.join(self.tmp, "stderr")

    def env(self, cookie=True):
        env = {
            "PLUGIN_UNIX_SOCKET_DIR": self.sock_dir,
            "PLUGIN_MIN_PORT": "10000",
            "PLUGIN_MAX_PORT": "25000",
            "PLUGIN_PROTOCOL_VERSIONS": "1",
        }
        if cookie:
            env[sp.COOKIE_KEY] = sp.COOKIE_VALUE
        return env

    def start(self, script=EXAMPLE, cookie=True):
        """Starts a plugin as the router does (its own process group, only
        the router's variables) and reads its handshake line."""
        self.stderr = open(self.stderr_path, "w")
        self.addCleanup(self.stderr.close)
        p = subprocess.Popen([sys.executable, script], env=self.env(cookie), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=self.stderr, start_new_session=True)
        self.addCleanup(self.kill_group, p.pid)
        self.addCleanup(p.stdout.close)
        return p

    def kill_group(self, pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def handshake(self, p):
        ready, _, _ = select.select([p.stdout], [], [], TIMEOUT)
        self.assertTrue(ready, f"no handshake within {TIMEOUT} s")
        line = p.stdout.readline().decode()
        fields = line.rstrip("\n").split("|")
        self.assertEqual(len(fields), 5, line)
        self.assertEqual(fields[:3], ["1", "1", "unix"])
        self.assertEqual(fields[4], "grpc")
        self.assertEqual(os.path.dirname(fields[3]), self.sock_dir)
        self.assertRegex(os.path.basename(fields[3]), r"^plugin[0-9]+$")
        return fields[3]

    def stderr_lines(self):
        with open(self.stderr_path) as f:
            return f.read().splitlines()

    def test_without_the_cookie(self):
        p = self.start(cookie=False)
        self.assertEqual(p.wait(TIMEOUT), 1)
        self.assertEqual(p.stdout.read(), b"")
        self.assertIn("It is not meant to be run directly", "\n".join(self.stderr_lines()))

    def test_invalid_types_exit_1_before_the_handshake(self):
        """Invalid types: one JSON line at error on stderr naming every
        problem (the router shows it), nothing on stdout, exit 1."""
        script = os.path.join(self.tmp, "bad_types.py")
        with open(script, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {SDK_DIR!r})\nimport switchyard_plugin as sp\n"
                    "sp.serve('0.1.0', [sp.TypeInfo(name='a', kind=sp.Kind.SCORER, doc='d', new=print, inputs=64), 'b'])\n")
        p = self.start(script)
        self.assertEqual(p.wait(TIMEOUT), 1)
        self.assertEqual(p.stdout.read(), b"")
        lines = [json.loads(line) for line in self.stderr_lines()]
        self.assertEqual([(e["@level"], e["@message"], e["error"]) for e in lines], [
            ("error", "invalid plugin types",
             "type \"a\" has inputs 64, not an Inputs value of known bits; type #1 is 'b', not a TypeInfo")])

    def test_handshake_describe_shutdown(self):
        p = self.start()
        path = self.handshake(p)
        with grpc.insecure_channel("unix:" + path) as ch:
            d = plugin_pb2_grpc.PluginStub(ch).Describe(pb.DescribeRequest(api_versions=[1]), timeout=TIMEOUT)
            self.assertEqual((d.plugin_version, [t.name for t in d.types]), ("0.1.0", ["queue-depth"]))
            grpc_controller_pb2_grpc.GRPCControllerStub(ch).Shutdown(grpc_controller_pb2.Empty(), timeout=TIMEOUT)
        self.assertEqual(p.wait(TIMEOUT), 0)
        self.assertEqual(p.stdout.read(), b"")  # nothing after the handshake line

    def test_sigterm_kills_the_group_and_removes_the_socket_dir(self):
        p = self.start(CHILD_PLUGIN)
        self.handshake(p)
        child = self.child_pid()
        self.assertTrue(alive(child))
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(TIMEOUT), -signal.SIGKILL)
        eventually(lambda: not alive(child), "the plugin's child is gone")
        self.assertFalse(os.path.exists(self.sock_dir))
        self.assertIn("SIGTERM", self.stopping_reason())
        # The plugin's own log line, in hclog's JSON format.
        entry = next(json.loads(l) for l in self.stderr_lines() if '"a log line"' in l)
        self.assertEqual({k: entry[k] for k in ("@level", "@message", "@module", "answer")},
                         {"@level": "info", "@message": "a log line", "@module": "child-plugin", "answer": 42})
        self.assertRegex(entry["@timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")

    def test_parent_death(self):
        """The router dies (here a launcher process exits): the plugin
        notices its parent pid changed, removes its socket directory and
        kills its group."""
        launcher = (
            "import subprocess, sys\n"
            f"p = subprocess.Popen([sys.executable, {CHILD_PLUGIN!r}], stdout=subprocess.PIPE, stderr=sys.stderr,"
            " start_new_session=True)\n"
            "print(p.pid, p.stdout.readline().decode().strip(), flush=True)\n"
        )
        with open(self.stderr_path, "w") as err:
            out = subprocess.run([sys.executable, "-c", launcher], env=self.env(), stdout=subprocess.PIPE,
                                 stderr=err, timeout=TIMEOUT, check=True).stdout.decode().split()
        plugin = int(out[0])
        self.addCleanup(self.kill_group, plugin)
        self.assertTrue(out[1].endswith("|grpc"), out)
        eventually(lambda: not alive(plugin), "the plugin exits after its parent")
        child = self.child_pid()
        eventually(lambda: not alive(child), "the plugin's child is gone")
        self.assertFalse(os.path.exists(self.sock_dir))
        self.assertIn("the parent process", self.stopping_reason())

    def child_pid(self):
        eventually(lambda: any(l.startswith("child ") for l in self.stderr_lines()), "the child's pid is logged")
        return int(next(l for l in self.stderr_lines() if l.startswith("child ")).split()[1])

    def stopping_reason(self):
        """The JSON log line the plugin wrote on its way out: its reason."""
        for line in self.stderr_lines():
            if line.startswith("{"):
                entry = json.loads(line)
                if entry["@message"].startswith("stopping without the router"):
                    self.assertEqual(entry["@level"], "error")
                    return entry["reason"]
        self.fail(f"no stopping line in {self.stderr_lines()}")


class SocketDirTest(unittest.TestCase):
    def test_only_socket_directories_are_removed(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, True)
        other = os.path.join(tmp, "mine")
        os.mkdir(other)
        self.assertIsNone(remove_socket_dir(other))
        self.assertTrue(os.path.isdir(other))  # not named sy-*
        d = os.path.join(tmp, "sy-1")
        os.mkdir(d)
        with open(os.path.join(d, "notes"), "w"):
            pass
        self.assertEqual(remove_socket_dir(d), "not removed: notes is not a socket")
        self.assertTrue(os.path.isdir(d))


if __name__ == "__main__":
    unittest.main()
