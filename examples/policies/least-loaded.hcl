# Least-loaded: the worker with the fewest in-flight requests, uniform among
# ties. Reads only ACTIVE_REQUESTS, so it runs on the hosted fast path.
router {
  block_size = 512
  seed       = 7
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
