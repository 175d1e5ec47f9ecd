# Peer baseline: AIBrix's prefix-cache routing policy (issue #30, part 1).
#
# Source read: github.com/vllm-project/aibrix @ e3e10f9e4aebe9aac5e7d992fb87d2648e01628b
#   pkg/plugins/gateway/algorithms/prefix_cache.go (last changed at
#     ab083c05bf9b2faec54dd6e7b0738975f68885dd): routeOriginal,
#     getTargetPodListOnLoadImbalance, getTargetPodFromMatchedPods
#   pkg/plugins/gateway/algorithms/least_request.go: selectTargetPodWithLeastRequestCount
#   pkg/plugins/gateway/algorithms/util.go: mean, standardDeviation (divides by n - 1)
#   pkg/utils/prefixcacheindexer/hash.go (last changed at
#     3960204e94f420f4e4ee1337ae8426337397d4f3): MatchPrefix, getPrefixHashes
#
# Rule (count = a pod's running requests as the gateway tracks them):
#   if max_count - min_count > 8 (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT):
#       prefix matching is restricted to the pods with min_count;
#   match% per pod = matched blocks * 100 / prompt blocks (full 4-character blocks of
#       the default "character" tokenizer); among pods with a match, shuffled, then
#       sorted by match% descending and count ascending, the first whose count
#       <= mean + 1 * stddev (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR) of all
#       pods' counts;
#   if none: a random pod with the fewest running requests.
#
# Mapping: the cache-aware picker: cache_threshold 0 (any held block is a match),
# balance_abs 8 with the relative test off, imbalanced = "match-least-loaded",
# match_ties = "least-loaded", stddev_factor 1, random ties.
#
# What this file cannot reproduce:
# - the index: AIBrix hashes 4-character blocks of the text it routed (router-side,
#   with eviction); Switchyard matches its own prefix index in KV blocks (512-token
#   blocks on the bundled traces), and the match is a ratio in tokens rather than an
#   integer percent of blocks (AIBrix's rounding down can tie two pods whose matches
#   differ by less than 1%).
# - the KV-event-sync variant (kvSyncPrefixCacheRouter, off by default) is not modelled.
router {
  block_size = 512
  seed       = 7
}

policy "aibrix" {
  picker "prefix-cache" {
    type            = "cache-aware"
    cache_threshold = 0
    balance_abs     = 8
    balance_rel     = 0
    imbalanced      = "match-least-loaded"
    match_ties      = "least-loaded"
    stddev_factor   = 1
    ties            = "random"
    seed            = 7
  }
}

worker_selection {
  aggregated = "aibrix"
}
