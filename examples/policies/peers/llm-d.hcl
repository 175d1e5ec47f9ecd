# Peer baseline: llm-d's default scheduler profile (issue #30, part 1). An
# approximation: its scores are min-max normalised per request, which no built-in
# scorer does.
#
# Source read: github.com/llm-d/llm-d-inference-scheduler, tree 520af47896e5f06e43d09aca281a1149187b0ffd
# (its Go module is now github.com/llm-d/llm-d-router; these files last changed at
# 247608c0b72a68f6cdee1c5036f90344b0a398af):
#   pkg/epp/config/loader/defaults.go                              (loadDefaultConfig)
#   pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go
#   pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go
#   pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go
#   pkg/epp/framework/plugins/scheduling/picker/maxscore/picker.go
#
# The default profile is three scorers and the max-score picker, no filter. Its
# current weights are queue 2, kv-cache-utilization 2, prefix-cache 3 (the
# kv-cache-utilization scorer is in the default too, not only the two the issue names):
#   queue  = (q_max - q) / (q_max - q_min), 1 when all equal     (q: engine waiting queue)
#   kvutil = 1 - kv_usage                                         (engine KV-cache usage)
#   prefix = match_blocks / total_blocks                          (router-side approximate
#                                                                  prefix index)
#   score  = 2 * queue + 2 * kvutil + 3 * prefix; the highest wins, ties shuffled.
#
# Mapping: kv-cost + min-cost (temperature 0 draws uniformly among ties, as the shuffle
# does). For one request, dividing a worker's kv-cost by the prompt's block count
# (the same for every worker, so the ranking is unchanged) gives
#   (active_prefill_tokens / prompt) + 1 - overlap_credit * match_ratio
#   + unsent_waiting + max(active_decode_blocks, kv_usage * total_blocks) / prompt_blocks
# so the prefix term is llm-d's match ratio weighted by overlap_credit, and queue and
# KV usage enter as work rather than as normalised scores. overlap_credit = 1.5 puts
# the prefix at llm-d's 3:2 weight against one queued prompt; that equivalence is
# ours, not llm-d's, and holds only roughly. engine_load = true because llm-d scores
# the engines' scraped waiting count and KV usage.
#
# What this file cannot reproduce with today's built-ins (the next step):
# - per-request min-max normalisation of the queue score (a scorer type that
#   normalises a load column over the candidates);
# - a KV-usage scorer on its own (1 - kv_usage), with its own weight;
# - a prefix scorer returning match_blocks / total_blocks, weighted against the
#   others (kv-cost charges absolute blocks);
# - max-score over a weighted sum of such normalised scores (min-cost over their
#   negation would do, once those scorers exist);
# - llm-d's approximate prefix index (router-side, LRU per server, its own block
#   size); Switchyard uses the engines' KV events or its own bookings, and the
#   bundled traces hash 512-token blocks;
# - the queue read is the engine's waiting count only; kv-cost also counts the
#   router's own in-flight prefill tokens.
router {
  block_size = 512
  seed       = 7
}

policy "llm-d" {
  scorer "cost" {
    type                  = "kv-cost"
    overlap_credit        = 1.5
    prefill_load_scale    = 1.0
    decode_request_weight = 0
    cpu_weight            = 0
    engine_load           = true
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

worker_selection {
  aggregated = "llm-d"
}
