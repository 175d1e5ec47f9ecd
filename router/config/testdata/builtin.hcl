# The policy file of DESIGN.md without the policy that uses plugin types:
# it loads, with two warnings (plugin "pd" and policy "rr" are unused).
router {
  block_size = 512
  seed       = 7
}

plugin "pd" {
  command       = "bin/disagg-filter-score-pick"
  sha256        = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  start_timeout = "5s"
  call_timeout  = "20ms"
}

policy "kv" {
  scorer "cost" {
    type           = "kv-cost"
    overlap_credit = 1.0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

policy "rr" {
  picker "rr" { type = "round-robin" }
}

worker_selection {
  aggregated = "kv"
  decode     = "default"
}

request_classifier {
  type = "header-priority"
}
