# least-active with a cap, served by the Node.js example plugin
# (examples/node-plugin/plugin.js, written from docs/plugin-protocol.md
# alone): drop the workers with 32 or more requests in flight, score the
# rest by their in-flight requests plus their engines' queue lengths, and
# pick the lowest. Install its packages first (`make sdk-deps`, which runs
# npm ci in examples/node-plugin). Paths are relative to the router's
# working directory: run it from the repository's root.
router {
  block_size = 512
  seed       = 7
}

plugin "node" {
  # The interpreter's absolute path (docs/plugin-protocol.md, section 1): a
  # bare "node" is whatever the router's PATH finds first, such as an nvm
  # shim. Debian's and NodeSource's nodejs packages install /usr/bin/node.
  command = "/usr/bin/node"
  args    = ["examples/node-plugin/plugin.js"]
  # The plugin gets no environment but this; it finds its node_modules and
  # the .proto files next to its script.
  # Node and grpc-js start in about 0.3 s; a busy machine takes seconds.
  start_timeout = "30s"
}

policy "least-active" {
  filter "cap" {
    type                = "node-max-active" # declared by plugin "node"
    max_active_requests = 32
  }
  scorer "active" {
    type           = "node-least-active" # declared by plugin "node"
    waiting_weight = 1.0
  }
  picker "pick" {
    type = "min-cost"
    seed = 7
  }
  # Answers while the plugin fails, times out or restarts, and when the
  # filter leaves no worker.
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "least-active"
}
