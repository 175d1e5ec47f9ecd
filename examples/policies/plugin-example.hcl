# queue-depth, the template plugin (cmd/plugin-example): score each worker by
# its in-flight requests plus the requests waiting in its engine's queue, and
# pick the lowest. The scorer runs out of process; min-cost runs in the
# router. Build the plugin first: `make build` puts it in bin/.
router {
  block_size = 512
  seed       = 7
}

plugin "example" {
  command = "bin/plugin-example"
  # sha256 = "..."   # optional: `sha256sum bin/plugin-example`; a mismatch refuses to start it
}

policy "queue" {
  scorer "depth" {
    type           = "queue-depth" # declared by plugin "example"
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
