# The policy file of DESIGN.md, verbatim. Policy "prefill" uses types from
# plugin "pd", which a load without a plugin host cannot resolve.
router {
  block_size = 512          # tokens per KV block for prefix hashing
  seed       = 7            # fixed draws for reproducible replays
}

plugin "pd" {
  command       = "bin/disagg-filter-score-pick"
  sha256        = "..."     # optional; when set, a mismatch refuses to start the plugin
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

policy "prefill" {
  filter "overlap" {
    type                      = "min-overlap"   # a type declared by plugin "pd"
    min_device_overlap_blocks = 2
  }
  scorer "cost" { type = "prefill-cost" }
  picker "lowest" { type = "lowest-cost" }
  fallback = "least-loaded"
}

policy "rr" {
  picker "rr" { type = "round-robin" }       # picker-only: runs on the hosted path
}

worker_selection {
  aggregated = "kv"
  prefill    = "prefill"
  decode     = "default"
}

request_classifier {
  type = "header-priority"
}
