# Session soft pin with the soft-pin-repin plugin: a conversation stays on
# its worker while that worker has at most 8 requests in flight, and moves
# (and is re-pinned) to the least-loaded other worker when it has more.
# Requests without a session go to the least-loaded worker.
#
# Build the plugin first (see examples/soft-pin-repin/README.md).
router {
  block_size = 512
  seed       = 7
}

plugin "pin" {
  command = "bin/soft-pin-repin"
}

policy "sticky" {
  picker "pin" {
    type                = "soft-pin" # declared by plugin "pin"
    max_active_requests = 8
    max_sessions        = 100000
  }
  fallback = "least-loaded"
}

worker_selection {
  aggregated = "sticky"
}
