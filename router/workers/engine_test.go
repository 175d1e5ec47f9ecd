package workers

import (
	"fmt"
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

// one is the report of an engine without ranks.
func one(l *fleet.EngineLoad, running int64, hasRunning bool) Engine {
	return Engine{Ranks: []Rank{{Load: l, Running: running, HasRunning: hasRunning}}}
}

func TestParseEngineText(t *testing.T) {
	for _, tt := range []struct {
		name string
		text string
		want Engine
	}{
		{"vllm", vllmMetrics, func() Engine {
			e := one(&fleet.EngineLoad{KVUsage: 0.42, HasKVUsage: true, Waiting: 7, HasWaiting: true}, 3, true)
			e.Counters = map[string]float64{`vllm:prompt_tokens_total{engine="0",model_name="llama"}`: 12345}
			return e
		}()},
		{"sglang", sglangMetrics, one(&fleet.EngineLoad{KVUsage: 0.25, HasKVUsage: true, Waiting: 2, HasWaiting: true}, 5, true)},
		{"old vllm percent", "vllm:gpu_cache_usage_perc 85\nvllm:num_requests_waiting 0\n",
			one(&fleet.EngineLoad{KVUsage: 0.85, HasKVUsage: true, Waiting: 0, HasWaiting: true}, 0, false)},
		{"old vllm fraction", "vllm:gpu_cache_usage_perc 0.5\n",
			one(&fleet.EngineLoad{KVUsage: 0.5, HasKVUsage: true}, 0, false)},
		{"new name wins", "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n",
			one(&fleet.EngineLoad{KVUsage: 0.1, HasKVUsage: true}, 0, false)},
		{"clamped", "vllm:kv_cache_usage_perc 250\nvllm:num_requests_waiting -1\n",
			one(&fleet.EngineLoad{KVUsage: 1, HasKVUsage: true, Waiting: 0, HasWaiting: true}, 0, false)},
		{"NaN ignored", "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting 4\n",
			one(&fleet.EngineLoad{Waiting: 4, HasWaiting: true}, 0, false)},
		{"counts sum over models", "vllm:num_requests_waiting{model_name=\"a\"} 2\nvllm:num_requests_waiting{model_name=\"b\"} 3\n",
			one(&fleet.EngineLoad{Waiting: 5, HasWaiting: true}, 0, false)},
		{"running only: no load", "vllm:num_requests_running 2\n", one(nil, 2, true)},
		// Counts past int64 (or a sum that overflows to +Inf) must not wrap
		// to a negative count, which reads as an idle engine.
		{"huge counts capped", "vllm:num_requests_waiting 1e300\nvllm:num_requests_running 9.3e18\n",
			one(&fleet.EngineLoad{Waiting: maxCount, HasWaiting: true}, maxCount, true)},
		{"sum past the largest float capped", "vllm:num_requests_waiting{model_name=\"a\"} 1.7e308\nvllm:num_requests_waiting{model_name=\"b\"} 1.7e308\n",
			one(&fleet.EngineLoad{Waiting: maxCount, HasWaiting: true}, 0, false)},
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

// vllmDP is a vLLM engine with two data-parallel ranks: its per-rank
// series carry engine="N", and cache_config_info reports each rank's
// blocks.
const vllmDP = `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="1024"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.1
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 1.0
vllm:num_requests_running{engine="1",model_name="llama"} 12.0
`

func TestParseEngineRanksAndCapacity(t *testing.T) {
	for _, tt := range []struct {
		name string
		text string
		want Engine
	}{
		{"vllm data parallel: one report per rank", vllmDP, Engine{Ranked: true, Ranks: []Rank{
			{Rank: 0, Load: &fleet.EngineLoad{KVUsage: 0.1, HasKVUsage: true, HasWaiting: true}, Running: 1, HasRunning: true, CapacityTokens: 2048 * 16, BlockSize: 16},
			{Rank: 1, Load: &fleet.EngineLoad{KVUsage: 1, HasKVUsage: true, Waiting: 9, HasWaiting: true}, Running: 12, HasRunning: true, CapacityTokens: 1024 * 16, BlockSize: 16},
		}}},
		{"vllm engine 0 only: not ranked", `vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1
vllm:num_requests_waiting{engine="0"} 3
`, Engine{Ranks: []Rank{{Load: &fleet.EngineLoad{Waiting: 3, HasWaiting: true}, CapacityTokens: 3200, BlockSize: 32}}}},
		{"a single rank other than 0 is ranked", `vllm:num_requests_waiting{engine="3"} 1
`, Engine{Ranked: true, Ranks: []Rank{{Rank: 3, Load: &fleet.EngineLoad{Waiting: 1, HasWaiting: true}}}}},
		{"older vllm: cache_config_info without engine applies to every rank", `vllm:cache_config_info{block_size="16",num_gpu_blocks="500"} 1
vllm:num_requests_waiting{engine="0"} 1
vllm:num_requests_waiting{engine="1"} 2
`, Engine{Ranked: true, Ranks: []Rank{
			{Rank: 0, Load: &fleet.EngineLoad{Waiting: 1, HasWaiting: true}, CapacityTokens: 8000, BlockSize: 16},
			{Rank: 1, Load: &fleet.EngineLoad{Waiting: 2, HasWaiting: true}, CapacityTokens: 8000, BlockSize: 16},
		}}},
		{"num_gpu_blocks None before profiling: block size only", `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1
`, Engine{Ranks: []Rank{{BlockSize: 16}}}},
		{"capacity without load", `vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1
`, Engine{Ranks: []Rank{{CapacityTokens: 160, BlockSize: 16}}}},
		{"sglang max_total_num_tokens and page_size", `sglang:max_total_num_tokens{model_name="qwen",tp_rank="0"} 471258
sglang:max_total_num_tokens{model_name="qwen",tp_rank="1"} 471258
sglang:page_size{model_name="qwen"} 1
sglang:num_queue_reqs{model_name="qwen"} 4
`, Engine{Ranks: []Rank{{Load: &fleet.EngineLoad{Waiting: 4, HasWaiting: true}, CapacityTokens: 471258, BlockSize: 1}}}},
		{"bad rank labels ignored", `vllm:num_requests_waiting{engine="x"} 5
vllm:num_requests_waiting{engine="1024"} 6
vllm:num_requests_waiting{engine="-1"} 7
vllm:num_requests_waiting{engine="0"} 1
`, Engine{Ranks: []Rank{{Load: &fleet.EngineLoad{Waiting: 1, HasWaiting: true}}}}},
		{"absurd capacity ignored", `vllm:cache_config_info{block_size="16",num_gpu_blocks="99999999999999999"} 1
`, Engine{Ranks: []Rank{{BlockSize: 16}}}},
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
}

// sglangDP is an SGLang server started with --dp-size 2 --tp-size 2
// --enable-dp-attention --enable-metrics --enable-priority-scheduling
// --enable-metrics-for-all-schedulers, in SGLang's own exposition: every
// scheduler's series carry its labels (SchedulerMetricsCollector.init_new,
// python/sglang/srt/observability/metrics_collector.py: model_name,
// engine_type, tp_rank, pp_rank, moe_ep_rank, priority when priority
// scheduling is on, and dp_rank when dp_size > 1), a queue's total under
// priority="" and its per-priority breakdown under priority="N"
// (_log_gauge_queue_count); with metrics for all schedulers, each
// tensor-parallel scheduler of a rank reports the rank's queue.
const sglangDP = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="1",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="",dp_rank="1"} 7.0
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="0",dp_rank="1"} 5.0
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="2",dp_rank="1"} 2.0
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="3",pp_rank="0",moe_ep_rank="3",priority="",dp_rank="1"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="",dp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="1",dp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="",dp_rank="1"} 9.0
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="3",pp_rank="0",moe_ep_rank="3",priority="",dp_rank="1"} 9.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="",dp_rank="0"} 0.25
sglang:token_usage{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="",dp_rank="1"} 0.9
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="",dp_rank="0"} 100000.0
sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="",dp_rank="1"} 90000.0
# HELP sglang:page_size KV cache page size in tokens.
# TYPE sglang:page_size gauge
sglang:page_size{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="",dp_rank="0"} 64.0
sglang:page_size{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1",priority="",dp_rank="1"} 64.0
`

// TestParseEngineSGLangDataParallel: an SGLang server's data-parallel
// ranks (dp_rank) are read as ranks, each with its own queue, running
// requests, KV usage and capacity; a queue is its total (priority=""),
// not its sum with its per-priority breakdown, and a rank's
// tensor-parallel schedulers count once. Before, dp_rank was not read:
// the ranks were one, their queues and every breakdown summed (running
// 27 for 10), their usage the largest.
func TestParseEngineSGLangDataParallel(t *testing.T) {
	got, err := ParseEngineText(strings.NewReader(sglangDP))
	if err != nil {
		t.Fatal(err)
	}
	want := Engine{Ranked: true, Ranks: []Rank{
		{Rank: 0, Load: &fleet.EngineLoad{KVUsage: 0.25, HasKVUsage: true, Waiting: 2, HasWaiting: true}, Running: 3, HasRunning: true, CapacityTokens: 100000, BlockSize: 64},
		{Rank: 1, Load: &fleet.EngineLoad{KVUsage: 0.9, HasKVUsage: true, Waiting: 9, HasWaiting: true}, Running: 7, HasRunning: true, CapacityTokens: 90000, BlockSize: 64},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Without --dp-size, SGLang labels no dp_rank: one rank, not ranked.
	one, err := ParseEngineText(strings.NewReader(`sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 4
sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 5000
`))
	if err != nil {
		t.Fatal(err)
	}
	if one.Ranked || len(one.Ranks) != 1 || one.Ranks[0].CapacityTokens != 5000 || one.Ranks[0].Load.Waiting != 4 {
		t.Errorf("SGLang without data parallelism: %+v", one)
	}
	// vLLM's engine label on an SGLang series, or SGLang's dp_rank on a
	// vLLM one, is no rank.
	mixed, err := ParseEngineText(strings.NewReader("sglang:num_queue_reqs{engine=\"1\"} 4\nvllm:num_requests_running{dp_rank=\"1\"} 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if mixed.Ranked || len(mixed.Ranks) != 1 || mixed.Ranks[0].Rank != 0 {
		t.Errorf("another engine's rank label read as a rank: %+v", mixed)
	}
}

func TestRouterBlocks(t *testing.T) {
	for _, tt := range []struct{ tokens, bs, want int64 }{
		{2048 * 16, 512, 64}, // vLLM: 2048 blocks of 16 tokens = 64 router blocks of 512
		{471258, 512, 920},   // SGLang: floor(471258/512)
		{511, 512, 0},        // less than one router block: unavailable
		{0, 512, 0},
		{100, 0, 0},
	} {
		if got := RouterBlocks(tt.tokens, tt.bs); got != tt.want {
			t.Errorf("RouterBlocks(%d, %d) = %d, want %d", tt.tokens, tt.bs, got, tt.want)
		}
	}
}

// sglangDocMetrics is SGLang's own example of its /metrics page, trimmed
// to the families the router reads and a histogram: SGLang's
// docs/references/production_metrics.md (sgl-project/sglang@00b08c49).
const sglangDocMetrics = `# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:func_latency_seconds Function latency in seconds
# TYPE sglang:func_latency_seconds histogram
sglang:func_latency_seconds_sum{name="generate_request"} 4.514771912145079
sglang:func_latency_seconds_bucket{le="0.05",name="generate_request"} 14006.0
sglang:func_latency_seconds_bucket{le="+Inf",name="generate_request"} 14007.0
sglang:func_latency_seconds_count{name="generate_request"} 14007.0
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:num_used_tokens The number of used tokens
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct"} 123859.0
# HELP sglang:gen_throughput The generate throughput (token/s)
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="meta-llama/Llama-3.1-8B-Instruct"} 86.50814177726902
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
`

// vllmCapacityMetrics adds to vllmMetrics what vLLM V1 serves besides:
// the cache_config_info info gauge (vllm/v1/metrics/loggers.py
// log_metrics_info: a gauge of 1 whose labels are CacheConfig's fields and
// engine), the request_success counter with its finished_reason label
// (loggers.py), and prometheus_client's process collector's start time.
const vllmCapacityMetrics = vllmMetrics + `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama"} 9.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"} 1.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.71234567e+09
`

// TestParseEngineUnderscoreNames: the underscore spelling of the engines'
// metric names, which OpenMetrics' escaping=underscores and sgl-router's
// /engine_metrics aggregation produce (sglang PR 12970; sgl-router's
// metrics aggregator test renders the production_metrics.md sample as
// sglang_num_running_reqs{...}), reads as the colon spelling does. Before,
// only the colon spelling was read: an SGLang engine scraped that way had
// its load unknown, and a max_kv_usage filter let it through.
func TestParseEngineUnderscoreNames(t *testing.T) {
	for _, tt := range []struct{ name, colon string }{
		{"sglang", sglangDocMetrics},
		{"vllm", vllmCapacityMetrics},
		{"vllm data parallel", vllmDP},
		{"sglang data parallel", sglangDP},
		{"sglang capacity", "sglang:max_total_num_tokens{model_name=\"qwen\"} 471258\nsglang:page_size{model_name=\"qwen\"} 64\nsglang:token_usage 0.5\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := ParseEngineText(strings.NewReader(tt.colon))
			if err != nil {
				t.Fatal(err)
			}
			if !want.HasLoad() && len(want.Ranks) == 0 {
				t.Fatal("the colon spelling reads as nothing: the test proves nothing")
			}
			underscored := strings.NewReplacer("sglang:", "sglang_", "vllm:", "vllm_").Replace(tt.colon)
			got, err := ParseEngineText(strings.NewReader(underscored))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("underscore spelling (-colon +underscore):\n%s", diff)
			}
		})
	}
	got, err := ParseEngineText(strings.NewReader(sglangDocMetrics))
	if err != nil {
		t.Fatal(err)
	}
	want := one(&fleet.EngineLoad{KVUsage: 0.28, HasKVUsage: true, Waiting: 2826, HasWaiting: true}, 162, true)
	want.Counters = map[string]float64{
		`sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"}`:     8128902,
		`sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"}`: 7557572,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SGLang's own sample (-want +got):\n%s", diff)
	}
	// Both spellings in one answer: the colon one, the engine's own, wins.
	got, err = ParseEngineText(strings.NewReader("sglang_token_usage 0.9\nsglang:token_usage 0.1\n"))
	if err != nil || got.Ranks[0].Load.KVUsage != 0.1 {
		t.Errorf("both spellings: %+v, %v; want KV usage 0.1", got, err)
	}
}

// TestRestarted: two scrapes of one engine tell a restart by its process
// start time increasing or a counter series going back, and nothing else.
func TestRestarted(t *testing.T) {
	parse := func(text string) Engine {
		t.Helper()
		e, err := ParseEngineText(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	first := parse(vllmCapacityMetrics)
	if first.StartTime != 1.71234567e9 || len(first.Counters) != 3 {
		t.Fatalf("signals of vLLM's page: start %v, counters %v", first.StartTime, first.Counters)
	}
	for _, tt := range []struct {
		name, later string
		want        string // "" when no restart
	}{
		{"same page", vllmCapacityMetrics, ""},
		{"counters grew", strings.Replace(vllmCapacityMetrics, "12345.0", "12400.0", 1), ""},
		{"prompt tokens went back", strings.Replace(vllmCapacityMetrics, "12345.0", "12.0", 1),
			`counter vllm:prompt_tokens_total{engine="0",model_name="llama"} went back from 12345 to 12`},
		{"one finished_reason went back", strings.Replace(vllmCapacityMetrics, `finished_reason="length",model_name="llama"} 1.0`, `finished_reason="length",model_name="llama"} 0.0`, 1),
			`counter vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"} went back from 1 to 0`},
		{"process started later", strings.Replace(vllmCapacityMetrics, "1.71234567e+09", "1.71234999e+09", 1),
			"process_start_time_seconds went from 1712345670 to 1712349990"},
		{"process start earlier is another engine, not a restart", strings.Replace(vllmCapacityMetrics, "1.71234567e+09", "1.7e+09", 1), ""},
		{"a series gone is no restart", strings.Replace(vllmCapacityMetrics, `vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama"} 9.0`+"\n", "", 1), ""},
		{"metrics without signals", "vllm:num_requests_waiting 1\n", ""},
		{"underscore spelling of the same counters", strings.ReplaceAll(strings.Replace(vllmCapacityMetrics, "12345.0", "5.0", 1), "vllm:", "vllm_"),
			`counter vllm:prompt_tokens_total{engine="0",model_name="llama"} went back from 12345 to 5`},
	} {
		why, restarted := Restarted(first, parse(tt.later))
		if restarted != (tt.want != "") || why != tt.want {
			t.Errorf("%s: Restarted = %v %q, want %q", tt.name, restarted, why, tt.want)
		}
	}
	// SGLang's counters (production_metrics.md) going back.
	why, restarted := Restarted(parse(sglangDocMetrics), parse(strings.Replace(sglangDocMetrics, "7.557572e+06", "3.0", 1)))
	if !restarted || !strings.Contains(why, "sglang:generation_tokens_total") {
		t.Errorf("SGLang counter back: %v %q", restarted, why)
	}
}

// TestCountersBounded: at most MaxCounterSeries series are kept, whatever
// the engine serves.
func TestCountersBounded(t *testing.T) {
	var b strings.Builder
	for i := range 3 * MaxCounterSeries {
		fmt.Fprintf(&b, "vllm:request_success_total{finished_reason=\"r%d\"} 1\n", i)
	}
	fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=%q} 1\n", strings.Repeat("m", 2*maxSeriesKeyBytes))
	e, err := ParseEngineText(strings.NewReader(b.String()))
	if err != nil || len(e.Counters) != MaxCounterSeries {
		t.Errorf("counters kept: %d, %v; want %d", len(e.Counters), err, MaxCounterSeries)
	}
}
