# Every block and attribute the loader knows, with no diagnostics.
router {
  block_size = 16
  seed       = -3
}

policy "kv" {
  filter "busy" {
    type                = "busy"
    max_active_requests = 64
    max_kv_usage        = 0.95
  }
  scorer "cost" {
    type                  = "kv-cost"
    weight                = 2
    overlap_credit        = 0.5
    decode_request_weight = 1
  }
  scorer "again" {
    type   = "kv-cost"
    weight = 0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0.25
  }
  fallback = "rr"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
  fallback = "default"
}

policy "tuned" {
  filter "all" {
    type    = "all-types"
    ratio   = 2.5
    count   = 3
    enabled = false
    label   = "x"
    timeout = "1m30s"
    prefer  = ["gpu-1", "gpu-0"]
    weights = [0.5, 2, -1]
  }
  picker "ll" {
    type = "least-loaded"
  }
  fallback = "round-robin"
}

worker_selection {
  aggregated = "kv"
  prefill    = "tuned"
  decode     = "kv"
}

request_classifier {
  type   = "header-priority"
  header = "x-tier"
}
