# Canary: the default KV-aware policy decides most requests, and the
# template plugin's queue-depth scorer (cmd/plugin-example) decides 5% of
# the sessions (by a hash of the x-session-id header, or of the trace's
# session_id in replay; a request without one hashes its request id), so a
# conversation stays on one side. When the candidate's fallback decides
# more than 5% of its decisions, or its time to first token at the 90th
# percentile passes 2 s, over the last 60 s (once 50 of its decisions are
# in), the canary switches itself off until the policy file is reloaded:
# docs/policy-file.md, "Canary". Rehearse it first with
# `router replay --policy examples/policies/canary.hcl` (or `--canary
# trial=0.2` for another weight). Build the plugin first: `make build`
# puts it in bin/.
router {
  block_size = 512
  seed       = 7
}

plugin "example" {
  command = "bin/plugin-example"
}

policy "live" {
  scorer "cost" {
    type = "kv-cost"
  }
  picker "pick" {
    type = "min-cost"
  }
  canary {
    policy = "trial"
    weight = 0.05      # the share of sessions the candidate decides
    key    = "session" # or "request": each request on its own
    rollback {
      max_fallback_share = 0.05  # of the candidate's decisions in the window
      max_ttft_p90       = "2s"  # "0s": judge fallbacks only
      window             = "60s" # sliding, in tenths
      min_requests       = 50    # decisions (first tokens for TTFT) before judging
    }
  }
}

# The candidate: a policy like any other, with instances of its own for
# each role that selects "live", and its own fallback (least-loaded, the
# default) answering when the plugin fails.
policy "trial" {
  scorer "depth" {
    type           = "queue-depth" # declared by plugin "example"
    waiting_weight = 1.0
  }
  picker "pick" {
    type = "min-cost"
  }
}

worker_selection {
  aggregated = "live"
}
