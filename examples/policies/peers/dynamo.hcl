# Peer baseline: Dynamo's KV router, default worker selection (issue #30, part 1).
#
# Source read: github.com/ai-dynamo/dynamo
#   lib/kv-router/src/scheduling/selector/default.rs  @ a4bdb9bfa1eed0afd4d67331f0938f9d5e3b58ed
#     (DefaultWorkerScorer::worker_logit, softmax_sample_index)
#   lib/kv-router/src/scheduling/config.rs            @ c2f2e1aa80696a009f8bdbf31629f829eb32f313
#     (an older KvRouterConfig: overlap_score_weight 1.0, router_temperature 0.0)
#   lib/llm/src/kv_router/scheduler.rs (an earlier DefaultWorkerSelector, same shape:
#     logit = overlap_score_weight * prefill_blocks + decode_blocks, divided by the max)
#
# Formula (per worker, lower is better, in KV blocks):
#   credit  = overlap_score_credit * device_overlap_blocks
#           + host_cache_hit_weight * host_overlap_blocks
#           + disk_cache_hit_weight * disk_overlap_blocks (+ shared-cache blocks)
#   logit   = prefill_load_scale * max(0, raw_prefill_blocks - credit)
#           + decode_blocks + decode_active_request_weight * active_requests
# raw_prefill_blocks = (the worker's active prefill tokens + this prompt) / block_size;
# it is computed outside default.rs (the selection input), seen in a secondary copy of
# the formula, not read at the commit above.
# Temperature 0 (the default) takes a lowest logit; T > 0 samples
#   p_i ~ exp(-(c_i - c_min) / ((c_max - c_min) * T)),
# which is exactly min-cost's range-normalised softmax. Ties at temperature 0 are a
# reservoir draw over candidates ordered by (worker_id, dp_rank), as min-cost's (the
# default picker's port in Dynamo's worker-selection plugin examples says so; seen in
# the file index, path not pinned).
# Defaults: overlap_score_credit 1.0, prefill_load_scale 1.0,
# decode_active_request_weight 0.0, router_temperature 0.0, overlap_score_credit_decay
# 0.0 (off), host_cache_hit_weight 0.75. The last three come from secondary copies of
# the newer config (the config.rs version read above predates them); not checked in
# the newest config.rs itself.
#
# Mapping: kv-cost with overlap_credit = overlap_score_credit, prefill_load_scale,
# decode_request_weight = decode_active_request_weight, cpu_weight =
# host_cache_hit_weight, engine_load = false (Dynamo scores its own active-block
# bookings, not the engines' KV usage), and min-cost at Dynamo's temperature.
#
# What this file cannot reproduce (no built-in type was added for Dynamo: the
# remaining terms need data the router does not keep, not a new formula):
# - decode_blocks: Dynamo's "potential" active blocks add this request's blocks to
#   each worker, deduplicated against the sequences already active there (a second,
#   in-flight prefix credit); kv-cost's decode term is the bookings alone.
# - the disk tier (disk_cache_hit_weight) and the shared-cache multiplier: the router
#   sees GPU and CPU tiers only.
# - overlap_score_credit_decay (off by default) and the decode-role variant
#   max(0, decode_blocks - credit) used when a decode router keeps a positive credit.
# - block granularity: the bundled Mooncake traces hash 512-token blocks, so overlap is
#   counted in 512-token blocks, not the engine's (16 to 64 tokens).
router {
  block_size = 512
  seed       = 7
}

policy "dynamo" {
  scorer "cost" {
    type                  = "kv-cost"
    overlap_credit        = 1.0
    prefill_load_scale    = 1.0
    decode_request_weight = 0
    cpu_weight            = 0.75
    engine_load           = false
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

worker_selection {
  aggregated = "dynamo"
}
