# Peer baseline: AIBrix's prefix-cache routing policy (issue #30, part 1). An
# approximation: its mean-plus-one-standard-deviation guard has no built-in
# equivalent.
#
# Source read: github.com/vllm-project/aibrix, tree e3e10f9e4aebe9aac5e7d992fb87d2648e01628b
#   pkg/plugins/gateway/algorithms/prefix_cache.go (last changed at
#     ab083c05bf9b2faec54dd6e7b0738975f68885dd): routeOriginal,
#     getTargetPodListOnLoadImbalance, getTargetPodFromMatchedPods
#   pkg/utils/prefixcacheindexer/hash.go (last changed at
#     3960204e94f420f4e4ee1337ae8426337397d4f3): MatchPrefix
#
# Rule (count = a pod's running requests):
#   if max_count - min_count > 8 (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT):
#       a random pod among those with min_count;
#   else: match% per pod = matched prefix blocks * 100 / prompt blocks (blocks of
#       4 tokens of the default "character" tokenizer, AIBRIX_PREFIX_CACHE_BLOCK_SIZE);
#       among pods with match% > 0, sorted by match% descending then count ascending
#       (shuffled first), the first whose count <= mean + 1 * stddev
#       (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR) of all pods' counts;
#       if none (or no match): the pod with the fewest running requests.
#
# Mapping: kv-affinity with balance_abs = 8 and balance_rel = 1 (with rel 1 the switch
# is AIBrix's absolute test alone: max > min always holds when max - min > 8), a large
# affinity so the highest match wins, spill_factor = 1 standing in for the
# mean + stddev guard, no decode term, and the router's own bookings only
# (engine_load = false).
#
# What this file cannot reproduce with today's built-ins (the next step):
# - the guard mean + 1 * stddev of running requests; spill_factor = 1 spills above
#   mean + 1 instead, stricter whenever the standard deviation exceeds one request;
# - in the imbalanced branch kv-affinity takes the least queued prefill work, not the
#   fewest running requests (and draws among ties as AIBrix does);
# - ties in match% go to fewer running requests in AIBrix; here to less queued
#   prefill work; the no-match fallback likewise;
# - the index: AIBrix hashes 4-character blocks of the text it routed (router-side,
#   20-minute eviction); Switchyard matches KV blocks, 512-token blocks on the bundled
#   traces;
# - the KV-event-sync variant (kvSyncPrefixCacheRouter, off by default) is not modelled.
router {
  block_size = 512
  seed       = 7
}

policy "aibrix" {
  scorer "cost" {
    type          = "kv-affinity"
    affinity      = 1000
    decode_weight = 0
    spill_factor  = 1
    balance_abs   = 8
    balance_rel   = 1
    engine_load   = false
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

worker_selection {
  aggregated = "aibrix"
}
