package workers

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/fleet"
)

// vllmMetrics is an excerpt of a vLLM v1 /metrics page.
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} 12345.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 0.5
`

// sglangMetrics is an excerpt of an SGLang /metrics page.
const sglangMetrics = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen"} 0.25
`

func TestParseEngineText(t *testing.T) {
	for _, tt := range []struct {
		name string
		text string
		want Engine
	}{
		{"vllm", vllmMetrics, Engine{Load: &fleet.EngineLoad{KVUsage: 0.42, HasKVUsage: true, Waiting: 7, HasWaiting: true}, Running: 3, HasRunning: true}},
		{"sglang", sglangMetrics, Engine{Load: &fleet.EngineLoad{KVUsage: 0.25, HasKVUsage: true, Waiting: 2, HasWaiting: true}, Running: 5, HasRunning: true}},
		{"old vllm percent", "vllm:gpu_cache_usage_perc 85\nvllm:num_requests_waiting 0\n",
			Engine{Load: &fleet.EngineLoad{KVUsage: 0.85, HasKVUsage: true, Waiting: 0, HasWaiting: true}}},
		{"old vllm fraction", "vllm:gpu_cache_usage_perc 0.5\n",
			Engine{Load: &fleet.EngineLoad{KVUsage: 0.5, HasKVUsage: true}}},
		{"new name wins", "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n",
			Engine{Load: &fleet.EngineLoad{KVUsage: 0.1, HasKVUsage: true}}},
		{"data parallel: counts sum, usage is the fullest", `vllm:num_requests_waiting{engine="0"} 2
vllm:num_requests_waiting{engine="1"} 3
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.7
vllm:num_requests_running{engine="0"} 1
vllm:num_requests_running{engine="1"} 1
`, Engine{Load: &fleet.EngineLoad{KVUsage: 0.7, HasKVUsage: true, Waiting: 5, HasWaiting: true}, Running: 2, HasRunning: true}},
		{"clamped", "vllm:kv_cache_usage_perc 250\nvllm:num_requests_waiting -1\n",
			Engine{Load: &fleet.EngineLoad{KVUsage: 1, HasKVUsage: true, Waiting: 0, HasWaiting: true}}},
		{"NaN ignored", "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting 4\n",
			Engine{Load: &fleet.EngineLoad{Waiting: 4, HasWaiting: true}}},
		{"running only: no load", "vllm:num_requests_running 2\n", Engine{Running: 2, HasRunning: true}},
		{"none", "process_cpu_seconds_total 3\n", Engine{}},
		{"empty", "", Engine{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEngineText(strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := ParseEngineText(strings.NewReader("vllm:num_requests_waiting{ 3\n")); err == nil {
		t.Error("malformed text parsed")
	}
}
