# Disaggregated prefill/decode serving with `router serve`: model "llama" has
# no aggregated worker, so each request is served in two hops (vLLM's
# disaggregated proxy protocol): a prefill worker computes the prompt's KV and
# answers its kv_transfer_params, then a decode worker fetches that KV and
# generates the answer, which streams back to the client. Response headers
# name both: x-switchyard-prefill-worker and x-switchyard-worker (decode).
#
# Start the engines, then the router:
#
#   bin/router mock-worker --listen 127.0.0.1:8001 --model llama   # and 8002, 8003, 8004
#   bin/router serve --policy examples/policies/serve-disagg.hcl
#
# Real engines: vLLM with a KV connector, prefill workers as producers and
# decode workers as consumers, e.g. --kv-transfer-config
# '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'.
# Prefill where the prompt's prefix is already cached, charged for the
# prefill work each worker has booked. The queue below applies to the
# prefill hop (admission), as it does to aggregated requests.
policy "prefill" {
  scorer "cost" {
    type           = "kv-cost"
    overlap_credit = 1.0
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

# Decode on the worker with the fewest booked KV blocks: the transferred KV
# is not in any decode worker's prefix cache, so overlap plays no part and
# the prompt's prefill cost is the same everywhere (scale 0 drops it).
policy "decode" {
  scorer "cost" {
    type                  = "kv-cost"
    prefill_load_scale    = 0
    decode_request_weight = 1
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

worker_selection {
  prefill = "prefill"
  decode  = "decode"
}

queue {
  max_active_requests = 32
  class "interactive" {
    weight = 1
  }
}

worker "prefill-a" {
  url             = "http://127.0.0.1:8001"
  role            = "prefill"
  models          = ["llama"]
}

worker "prefill-b" {
  url             = "http://127.0.0.1:8002"
  role            = "prefill"
  models          = ["llama"]
}

worker "decode-a" {
  url             = "http://127.0.0.1:8003"
  role            = "decode"
  models          = ["llama"]
}

worker "decode-b" {
  url             = "http://127.0.0.1:8004"
  role            = "decode"
  models          = ["llama"]
}
