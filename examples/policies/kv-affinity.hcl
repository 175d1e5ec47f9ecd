# The default policy, spelled out: prefer the worker that already holds the
# longest prefix of the prompt, credited beyond this request's own saving so
# that a conversation stays where its cache is, charged for the prefill
# queued there and (lightly) its decode load; ignore the prefix when the
# fleet's in-flight counts are imbalanced, and spill a worker past twice the
# mean in-flight count (builtin/README.md, kv-affinity).
router {
  block_size = 512
  seed       = 7
}

policy "kv-affinity" {
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

worker_selection {
  aggregated = "kv-affinity"
}
