# SLO-aware routing (issue #30): the default kv-affinity policy with the
# slo filter in front. The router predicts every candidate's TTFT and
# TPOT for the request (router/predict: an online model per worker class,
# learned from the answers). When some candidate is predicted to meet the
# request's targets (TTFT as predicted, TPOT with 25% headroom), the
# request goes where kv-affinity places it, exactly as the default does,
# unless the fleet mixes worker classes (switchyard.io/class): there
# divert = "classes" keeps the candidates predicted to meet the TTFT
# target, as the predictor knows which workers are fast and kv-affinity
# does not. ("always", the filter's default, keeps only the candidates
# meeting both targets on any fleet; measured, that moves session turns
# off their cache and loses to the default in 9 of the 54 cells of
# BENCHMARKS.md "SLO-aware routing", against 1 with "classes".)
#
# Targets come from the request's headers (docs/serve.md, "Latency
# targets"), else from its queue class, else from replay's --slo. When no
# candidate is predicted to meet them, on_miss decides (a request's own
# header or class wins): "wait" (here) keeps it in the router's queue,
# ordered by slack, until a candidate can meet its TTFT target, and sends
# it on once the target is gone or a worker is idle (no worker gets faster
# than idle); "least-late" sends it at once; "reject" answers 429 with Retry-After. A request of negative
# priority is refused first. BENCHMARKS.md, "SLO-aware routing", compares
# it with the default and the peers' policies.
#
#   router replay --policy examples/policies/slo.hcl --slo ttft=1s
#   router replay --compare examples/policies/kv-affinity.hcl,examples/policies/slo.hcl \
#       --slo ttft=1s --baseline kv-affinity --workers 4,8,16
router {
  block_size = 512
  seed       = 7
}

policy "slo" {
  filter "headroom" {
    type          = "slo"
    ttft_headroom = 0
    tpot_headroom = 0.25
    on_miss       = "wait"
    divert        = "classes"
  }
  scorer "cost" {
    type          = "kv-affinity"
    affinity      = 4
    decode_weight = 0.03125
    spill_factor  = 2
    balance_abs   = 32
    balance_rel   = 2
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

queue {
  class "interactive" { order = "slack" }
}

worker_selection {
  aggregated = "slo"
}
