# KV-cache-aware cost policy kv-cost (the default before issue #14): prefer the
# worker that already holds the longest prefix of the prompt, charged for the
# prefill and decode work it already has, a decode block weighing a prefill block.
router {
  block_size = 512
  seed       = 7
}

policy "kv" {
  scorer "cost" {
    type                  = "kv-cost"
    overlap_credit        = 1.0
    prefill_load_scale    = 1.0
    decode_request_weight = 0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
    seed        = 7
  }
}

worker_selection {
  aggregated = "kv"
}
