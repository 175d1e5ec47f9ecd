# queue-depth again, served by the Python SDK's example scorer
# (sdk/python/examples/queue_depth.py) instead of the Go template plugin: the
# same costs, so `router replay` makes the same decisions as with
# plugin-example.hcl. Needs Debian's python3-grpcio and python3-protobuf
# (sdk/python/README.md). Paths are relative to the router's working
# directory: run it from the repository's root.
router {
  block_size = 512
  seed       = 7
}

plugin "python" {
  command = "/usr/bin/python3"
  args    = ["sdk/python/examples/queue_depth.py"]
  # The plugin gets no environment but this: the script finds the SDK next
  # to it; an SDK installed elsewhere needs env = { PYTHONPATH = "..." }.
  # Python starts slower than a Go binary: importing grpc and protobuf
  # takes about a quarter of a CPU second, several seconds on a busy
  # machine. 30 s rather than the default 5 s.
  start_timeout = "30s"
  # A Python plugin's Decide p99 under load is several times a Go one's
  # (docs/plugin-protocol.md, "Deadlines by language"): 50 ms rather than
  # the default 20 ms. `router plugins check` measures it on your host.
  call_timeout = "50ms"
}

policy "queue" {
  scorer "depth" {
    type           = "queue-depth" # declared by plugin "python"
    waiting_weight = 1.0
  }
  picker "pick" {
    type = "min-cost"
    seed = 7
  }
  # Answers while the plugin fails, times out or restarts.
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "queue"
}
