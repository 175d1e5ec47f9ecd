# Round-robin: each worker in turn, blind to load and cache. Picker-only with
# no declared input, so it runs on the hosted fast path.
router {
  block_size = 512
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
