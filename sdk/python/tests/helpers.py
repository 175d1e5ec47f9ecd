"""Test helpers: a PluginServer on a real gRPC server over a Unix socket."""

import importlib.util
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import grpc

from switchyard_plugin import PluginServer
from switchyard_plugin._pb import grpc_controller_pb2_grpc, health_pb2_grpc, plugin_pb2_grpc
from switchyard_plugin.server import GRPC_OPTIONS

SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(SDK_DIR, "examples", "queue_depth.py")
STICKY_EXAMPLE = os.path.join(SDK_DIR, "examples", "sticky_session.py")

#: A generous deadline for every call: the tests assert answers, never speed.
TIMEOUT = 60


class Served:
    """A PluginServer serving on a Unix socket, with client stubs."""

    def __init__(self, types, version="1.2.3", **kw):
        self.dir = tempfile.mkdtemp(prefix="sy-test-")
        self.plugin = PluginServer(version, types, **kw)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=16), options=GRPC_OPTIONS)
        self.plugin.add_to(self.server)
        addr = "unix:" + os.path.join(self.dir, "plugin")
        self.server.add_insecure_port(addr)
        self.server.start()
        self.channel = grpc.insecure_channel(addr, options=GRPC_OPTIONS)
        self.stub = plugin_pb2_grpc.PluginStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.controller = grpc_controller_pb2_grpc.GRPCControllerStub(self.channel)

    def close(self):
        self.channel.close()
        self.server.stop(None).wait()
        self.plugin.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def load_example(path=EXAMPLE):
    """Imports an example (examples/queue_depth.py by default) as a module:
    it is a script, not a package."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
