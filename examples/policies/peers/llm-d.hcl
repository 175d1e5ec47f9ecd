# Peer baseline: llm-d's default scheduler profile (issue #30, part 1).
#
# Source read: github.com/llm-d/llm-d-router (the repository
# llm-d/llm-d-inference-scheduler moved to; its files below at the commits named):
#   pkg/epp/config/loader/defaults.go @ 159e739b98ed45c3974bd00a951edbf2778e3322
#     (loadDefaultConfig, in llm-d-inference-scheduler): the "default" profile holds
#     queue-scorer weight 2, kv-cache-utilization-scorer weight 2 and
#     prefix-cache-scorer weight 3, no filter; ensureSchedulingLayer adds the
#     max-score-picker.
#   pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go @ 2342697faf4e5a1a3ebf5e95d9ca5c903ba64c4a
#   pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go @ 2342697faf4e5a1a3ebf5e95d9ca5c903ba64c4a
#   pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go @ 068b68d08c44a311012602f9e051276c689ef9c3
#   pkg/epp/framework/plugins/scheduling/picker/maxscore/picker.go @ 0fa77a00202aa8c1bd72a9b3aa5b647e82f2e47f
#   pkg/epp/framework/plugins/scheduling/picker/common.go @ 5155e4cbfb5ce9e7abbca075eb2130cf9492072f
#
# Rule, per candidate (scores in [0, 1], higher better):
#   queue  = (q_max - q) / (q_max - q_min), 1 when all equal   (q: the engine's waiting count)
#   kvutil = 1 - kv_usage                                       (the engine's KV-cache usage)
#   prefix = match_blocks / total_blocks                        (prefixLengthWeight 0, the default)
#   score  = 2 * queue + 2 * kvutil + 3 * prefix
# The highest score wins; equal scores are taken in turn (RotateScoredEndpoints: a
# round-robin counter over the tied endpoints, which replaced a random shuffle).
#
# Mapping: three normalized-score scorers with llm-d's weights (each writes
# 1 - score, so the weighted cost sum is 7 - llm-d's score and ranks alike) and
# min-cost at temperature 0 with ties = "rotate".
#
# What this file cannot reproduce:
# - the prefix index: llm-d's prefix scorer reads its own approximate, router-side
#   index (its own block size, LRU per server); Switchyard's CACHE column is its own
#   prefix index (the engines' KV events, or its bookings), in the request's blocks:
#   512-token blocks on the bundled traces. The match ratio is taken in tokens
#   (overlap * block_size / prompt), which differs from blocks / blocks only by the
#   prompt's partial last block.
# - metric staleness: llm-d scrapes the engines' metrics periodically; the simulated
#   engines report after every change, so llm-d's queue and KV-usage scores are
#   fresher here than in a cluster.
# - the rotation counter is per picker instance here, shared by all pickers of the
#   process in llm-d; its tied endpoints are in the scheduler's order, here in
#   ascending worker id.
# - the flow-control layer and saturation detector llm-d adds by default (they queue
#   or shed at saturation; they do not choose among endpoints).
router {
  block_size = 512
  seed       = 7
}

policy "llm-d" {
  scorer "queue" {
    type   = "normalized-score"
    signal = "queue"
    weight = 2
  }
  scorer "kv-cache-utilization" {
    type   = "normalized-score"
    signal = "kv-usage"
    weight = 2
  }
  scorer "prefix-cache" {
    type   = "normalized-score"
    signal = "prefix-match"
    weight = 3
  }
  picker "max-score" {
    type        = "min-cost"
    temperature = 0
    ties        = "rotate"
  }
}

worker_selection {
  aggregated = "llm-d"
}
