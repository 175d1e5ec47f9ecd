# Peer baseline: SGLang model gateway's cache_aware policy (issue #30, part 1).
#
# Source read: github.com/sgl-project/sglang
#   sgl-model-gateway/src/policies/cache_aware.rs @ b93974f140de1e545d9134d87e77f0bd1fbf3014
#     (CacheAwarePolicy::select_worker, select_worker_min_load)
#   sgl-model-gateway/src/main.rs @ 01f6c92a0ae883504466f0be6235eb8e70651c46
#     (CliArgs: --cache-threshold 0.3, --balance-abs-threshold 64,
#     --balance-rel-threshold 1.5; the library's CacheAwareConfig::default in
#     src/policies/mod.rs says 0.5 / 32 / 1.1, but the gateway launched from the
#     command line, as documented, uses the CLI's)
#
# Rule (load = the gateway's in-flight request count per worker):
#   imbalanced = (max_load - min_load) > 64 and max_load > 1.5 * min_load
#   imbalanced:  the first least-loaded worker (min_by_key);
#   otherwise:   the longest prefix match of the request text in an approximate radix
#                tree of the text routed to each worker; match / len(text) > 0.3: the
#                worker holding that match (whatever its load); else the first
#                least-loaded worker.
#
# Mapping: the cache-aware picker with SGLang's defaults and ties = "first".
#
# What this file cannot reproduce:
# - the tree: SGLang matches the characters it routed (router-side, LRU-evicted every
#   120 s down to 64 Mi nodes), not the engines' cache; Switchyard matches its own
#   prefix index in KV blocks (512-token blocks on the bundled traces), so a match
#   counts whole blocks and the ratio is in tokens, not characters.
# - which worker wins a tie at the longest match: SGLang's tree returns one tenant of
#   the matched node; here the first in worker-id order. "First least-loaded" is the
#   first in SGLang's worker list, here in worker-id order.
router {
  block_size = 512
  seed       = 7
}

policy "sglang" {
  picker "cache-aware" {
    type            = "cache-aware"
    cache_threshold = 0.3
    balance_abs     = 64
    balance_rel     = 1.5
    imbalanced      = "least-loaded"
    match_ties      = "any"
    ties            = "first"
  }
}

worker_selection {
  aggregated = "sglang"
}
