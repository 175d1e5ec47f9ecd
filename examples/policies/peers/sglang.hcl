# Peer baseline: SGLang model gateway's cache_aware policy (issue #30, part 1). An
# approximation: the match-ratio threshold has no built-in equivalent.
#
# Source read: github.com/sgl-project/sglang
#   sgl-model-gateway/src/policies/cache_aware.rs @ b93974f140de1e545d9134d87e77f0bd1fbf3014
#     (CacheAwarePolicy::select_worker, select_worker_min_load)
#   sgl-router/src/policies/cache_aware.rs        @ 026f853ba7ae08a457a2e127b85a26256a29e300
#     (the earlier router: same guard; a miss went to the smallest tree, not the least load)
# Defaults cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5:
# the gateway's cache_aware parsing and its startup log, found by text search in
# copies of the repository; the config file's path and commit were not pinned.
#
# Rule (load = the gateway's in-flight request count per worker):
#   imbalanced = (max_load - min_load) > balance_abs_threshold
#                and max_load > balance_rel_threshold * min_load
#   imbalanced:  the least-loaded worker
#   otherwise:   match = the longest prefix of the request text in an approximate
#                radix tree of text routed per worker (characters, not tokens);
#                match / len(text) > cache_threshold: the worker holding that match;
#                else: the least-loaded worker.
#
# Mapping: kv-affinity with its imbalance switch set to SGLang's thresholds
# (balance_abs = 64, balance_rel = 1.5: the same test on in-flight counts; the switch
# was modelled on this policy), a large affinity so that the worker holding the
# longest prefix wins whatever its queue (SGLang ignores load once the match passes),
# no decode term and no bounded-load spill (SGLang has neither), and the router's own
# bookings only (engine_load = false: SGLang reads no engine metrics).
#
# What this file cannot reproduce with today's built-ins (the next step):
# - cache_threshold: below a 30% match SGLang ignores the match entirely and takes
#   the least-loaded worker; here any overlap of one block or more wins;
# - the miss branch picks the fewest in-flight requests; here, with no overlap
#   anywhere, the least queued prefill work wins (tokens, not requests);
# - the approximate tree: SGLang matches the characters it routed (with LRU
#   eviction), not the engines' cache; Switchyard matches KV blocks it sees or
#   books, and the bundled traces hash 512-token blocks;
# - ties: SGLang takes the tree's matched tenant or the first minimum; min-cost
#   draws uniformly among ties.
router {
  block_size = 512
  seed       = 7
}

policy "sglang" {
  scorer "cost" {
    type          = "kv-affinity"
    affinity      = 1000
    decode_weight = 0
    spill_factor  = 0
    balance_abs   = 64
    balance_rel   = 1.5
    engine_load   = false
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

worker_selection {
  aggregated = "sglang"
}
