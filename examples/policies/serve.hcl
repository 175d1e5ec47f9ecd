# A policy for `router serve` on one machine: three engines serving model
# "llama" (start them with `bin/router mock-worker --listen 127.0.0.1:8001
# --model llama`, and 8002, 8003), routed by the KV-aware default policy,
# with a queue when every engine has 32 requests in flight. The KV block
# size and capacity come from the engines' metrics (no router.block_size,
# no total_kv_blocks): configuration only overrides what they report.

queue {
  max_active_requests = 32
  class "interactive" {
    weight = 3
  }
  class "batch" {
    weight = 1
    order  = "wspt"
  }
}

request_classifier {
  type          = "header-priority"
  default_class = "interactive"
}

worker "a" {
  url    = "http://127.0.0.1:8001"
  models = ["llama"]
}

worker "b" {
  url    = "http://127.0.0.1:8002"
  models = ["llama"]
}

worker "c" {
  url    = "http://127.0.0.1:8003"
  models = ["llama"]
}
