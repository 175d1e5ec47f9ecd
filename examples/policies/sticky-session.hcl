# Sticky sessions through an out-of-process request classifier: the
# sticky-session classifier of the soft-pin-repin plugin learns, from the
# request lifecycle events the router streams to it, which worker served
# each session last, and sets that worker as the advisory target of the
# session's next request. The target is soft: when that worker is not a
# candidate the policy below decides alone. Requests without a session go
# to the least-loaded worker.
#
# Build the plugin first (see examples/soft-pin-repin/README.md).
router {
  block_size = 512
  seed       = 7
}

plugin "pins" {
  command = "bin/soft-pin-repin"
}

request_classifier {
  type         = "sticky-session" # declared by plugin "pins"
  ttl          = "10m"
  max_sessions = 100000
}

policy "least" {
  picker "least" {
    type = "least-loaded"
    seed = 7
  }
}

worker_selection {
  aggregated = "least"
}
