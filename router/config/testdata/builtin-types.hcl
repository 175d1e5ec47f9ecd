# Uses only the built-in types of catalog.Default(); loads with no diagnostics.
router {
  block_size = 512
  seed       = 7
}

policy "kv" {
  filter "busy" {
    type                = "busy"
    max_active_requests = 64
    max_kv_usage        = 0.95
  }
  scorer "cost" {
    type           = "kv-cost"
    overlap_credit = 1.0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0.5
  }
  fallback = "p2c"
}

policy "p2c" {
  picker "p2c" {
    type = "power-of-two"
  }
  fallback = "random"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "kv"
  prefill    = "rr"
}
