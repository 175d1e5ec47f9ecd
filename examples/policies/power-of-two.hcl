# Power of two choices: two distinct random workers, the less busy one wins.
# Reads only ACTIVE_REQUESTS, so it runs on the hosted fast path.
router {
  block_size = 512
  seed       = 7
}

policy "p2c" {
  picker "p2c" {
    type = "power-of-two"
    seed = 7
  }
}

worker_selection {
  aggregated = "p2c"
}
