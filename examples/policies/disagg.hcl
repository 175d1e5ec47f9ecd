# Disaggregated serving with the disagg-filter-score-pick plugin: the prefill
# role keeps workers holding enough of the prompt's prefix, scores pending
# prefill plus uncached blocks, and picks the lowest; the decode role picks
# the worker with the fewest booked decode blocks. Each role's whole policy
# lives in the plugin: one Decide round trip per request.
#
#   router replay --policy examples/policies/disagg.hcl --prefill-workers 4 --decode-workers 4
#
# Build the plugin first (see examples/disagg-filter-score-pick/README.md).
router {
  block_size = 512
  seed       = 7
}

plugin "pd" {
  command = "bin/disagg-filter-score-pick"
}

policy "prefill" {
  filter "overlap" {
    type = "min-overlap"
    # The filter is strict: with a threshold above 0, a request whose prefix
    # no prefill worker holds yet (every cold request) is filtered out and
    # rejected; all-filtered is the policy's answer, not a failure, so the
    # fallback does not take over. Raise it only where a prefix miss is
    # worse than a rejection.
    min_device_overlap_blocks = 0
  }
  scorer "cost" {
    type = "prefill-cost"
  }
  picker "lowest" {
    type = "lowest-cost"
  }
  fallback = "least-loaded"
}

policy "decode" {
  scorer "cost" {
    type = "decode-cost"
  }
  picker "lowest" {
    type = "lowest-cost"
  }
  fallback = "least-loaded"
}

worker_selection {
  prefill = "prefill"
  decode  = "decode"
}
