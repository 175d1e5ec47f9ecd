package mockworker

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine metrics under the engine's names, in a private
// registry, plus process_start_time_seconds (set when the Server is
// made, as prometheus_client's process collector reports the API
// server's start: a restart shows as a later value).
//
// vLLM (vllm/v1/metrics/loggers.py): every series labelled model_name
// and engine (the data-parallel rank, "0" without data parallelism);
// vllm:cache_config_info is an info gauge (value 1) per engine whose
// labels carry the cache configuration.
//
// SGLang (python/sglang/srt/observability/metrics_collector.py@44cedc2b,
// SchedulerMetricsCollector): labelled model_name, engine_type
// ("unified"), tp_rank, pp_rank, moe_ep_rank ("0") and, with more than
// one data-parallel rank, dp_rank; sglang:num_running_reqs,
// sglang:num_queue_reqs, sglang:token_usage, sglang:cache_hit_rate,
// sglang:num_used_tokens, the constants sglang:max_total_num_tokens,
// sglang:page_size, sglang:num_pages, sglang:context_len, and the token
// and request counters.
//
// With MetricNamesUnderscore the colon after the engine's prefix is an
// underscore ("vllm_num_requests_running", "sglang_num_running_reqs").
type metrics struct {
	reg   *prometheus.Registry
	ranks []*rankMetrics
}

// rankMetrics are one data-parallel rank's series.
type rankMetrics struct {
	running, waiting, kvUsage prometheus.Gauge
	promptTokens              prometheus.Counter
	generationTokens          prometheus.Counter
	preemptions               prometheus.Counter
	cacheQueries, cacheHits   prometheus.Counter
	success                   prometheus.Counter
	kvEventBatches            prometheus.Counter
	// SGLang only (nil for vLLM): the hit rate, the KV tokens in use.
	hitRate, usedTokens prometheus.Gauge
}

func newMetrics(model string, cfg Config) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	start := prometheus.NewGauge(prometheus.GaugeOpts{Name: "process_start_time_seconds",
		Help: "Start time of the process since unix epoch in seconds."})
	start.Set(float64(time.Now().UnixNano()) / 1e9)
	m.reg.MustRegister(start)
	if cfg.Engine == EngineSGLang {
		m.sglang(model, cfg)
	} else {
		m.vllm(model, cfg)
	}
	return m
}

// name spells an engine metric: prefix "vllm" or "sglang", then ":" or
// "_", then the rest.
func name(cfg Config, prefix, rest string) string {
	if cfg.MetricNames == MetricNamesUnderscore {
		return prefix + "_" + rest
	}
	return prefix + ":" + rest
}

func (m *metrics) vllm(model string, cfg Config) {
	n := func(rest string) string { return name(cfg, "vllm", rest) }
	labels := []string{"model_name", "engine"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	running := gauge(n("num_requests_running"), "Number of requests in model execution batches.")
	waiting := gauge(n("num_requests_waiting"), "Number of requests waiting to be processed.")
	kvUsage := gauge(n("kv_cache_usage_perc"), "KV-cache usage. 1 means 100 percent usage.")
	promptTokens := counter(n("prompt_tokens_total"), "Number of prefill tokens processed.")
	generationTokens := counter(n("generation_tokens_total"), "Number of generation tokens processed.")
	preemptions := counter(n("num_preemptions_total"), "Cumulative number of preemption from the engine.")
	cacheQueries := counter(n("prefix_cache_queries_total"), "Prefix cache queries, in terms of number of queried tokens.")
	cacheHits := counter(n("prefix_cache_hits_total"), "Prefix cache hits, in terms of number of cached tokens.")
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: n("request_success_total"), Help: "Count of successfully processed requests.",
	}, []string{"model_name", "engine", "finished_reason"})
	batches := counter("mock_kv_event_batches_total", "KV event batches published (switchyard mock engine).")
	// vLLM's CacheConfig.metrics_info: every field of the cache config as a
	// label (str() of its value), plus engine. The mock sets the ones it
	// models; num_gpu_blocks and block_size are the simulated engine's,
	// prefix_caching_hash_algo the hash its events carry.
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: n("cache_config_info"), Help: "Information of the LLMEngine CacheConfig",
	}, []string{"block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization",
		"num_cpu_blocks", "num_gpu_blocks", "prefix_caching_hash_algo"})
	m.reg.MustRegister(running, waiting, kvUsage, promptTokens, generationTokens, preemptions,
		cacheQueries, cacheHits, success, batches, info)
	for r := range cfg.DataParallelSize {
		e := strconv.Itoa(r)
		m.ranks = append(m.ranks, &rankMetrics{
			running:          running.WithLabelValues(model, e),
			waiting:          waiting.WithLabelValues(model, e),
			kvUsage:          kvUsage.WithLabelValues(model, e),
			promptTokens:     promptTokens.WithLabelValues(model, e),
			generationTokens: generationTokens.WithLabelValues(model, e),
			preemptions:      preemptions.WithLabelValues(model, e),
			cacheQueries:     cacheQueries.WithLabelValues(model, e),
			cacheHits:        cacheHits.WithLabelValues(model, e),
			success:          success.WithLabelValues(model, e, "length"),
			kvEventBatches:   batches.WithLabelValues(model, e),
		})
		info.WithLabelValues(strconv.Itoa(cfg.Sim.BlockSize), "auto", "True", e, "0.9", "None",
			strconv.Itoa(cfg.Sim.TotalKVBlocks), "sha256_cbor").Set(1)
	}
}

func (m *metrics) sglang(model string, cfg Config) {
	n := func(rest string) string { return name(cfg, "sglang", rest) }
	labels := []string{"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
	if cfg.DataParallelSize > 1 {
		labels = append(labels, "dp_rank")
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	running := gauge(n("num_running_reqs"), "The number of running requests.")
	waiting := gauge(n("num_queue_reqs"), "The number of requests in the waiting queue.")
	tokenUsage := gauge(n("token_usage"), "The token usage.")
	hitRate := gauge(n("cache_hit_rate"), "The prefix cache hit rate.")
	used := gauge(n("num_used_tokens"), "The number of used tokens.")
	maxTokens := gauge(n("max_total_num_tokens"), "Maximum total number of tokens in the KV cache pool.")
	pageSize := gauge(n("page_size"), "KV cache page size in tokens.")
	pages := gauge(n("num_pages"), "Number of KV cache pages.")
	contextLen := gauge(n("context_len"), "Maximum context length.")
	promptTokens := counter(n("prompt_tokens_total"), "Number of prefill tokens processed.")
	generationTokens := counter(n("generation_tokens_total"), "Number of generation tokens processed.")
	cachedTokens := counter(n("cached_tokens_total"), "Number of cached prompt tokens.")
	requests := counter(n("num_requests_total"), "Number of requests processed.")
	retracted := counter(n("num_retracted_reqs_total"), "The number of retracted requests.")
	batches := counter("mock_kv_event_batches_total", "KV event batches published (switchyard mock engine).")
	m.reg.MustRegister(running, waiting, tokenUsage, hitRate, used, maxTokens, pageSize, pages, contextLen,
		promptTokens, generationTokens, cachedTokens, requests, retracted, batches)
	for r := range cfg.DataParallelSize {
		values := []string{model, "unified", "0", "0", "0"}
		if cfg.DataParallelSize > 1 {
			values = append(values, strconv.Itoa(r))
		}
		rm := &rankMetrics{
			running:          running.WithLabelValues(values...),
			waiting:          waiting.WithLabelValues(values...),
			kvUsage:          tokenUsage.WithLabelValues(values...),
			hitRate:          hitRate.WithLabelValues(values...),
			usedTokens:       used.WithLabelValues(values...),
			promptTokens:     promptTokens.WithLabelValues(values...),
			generationTokens: generationTokens.WithLabelValues(values...),
			preemptions:      retracted.WithLabelValues(values...),
			cacheQueries:     prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"}),
			cacheHits:        cachedTokens.WithLabelValues(values...),
			success:          requests.WithLabelValues(values...),
			kvEventBatches:   batches.WithLabelValues(values...),
		}
		m.ranks = append(m.ranks, rm)
		maxTokens.WithLabelValues(values...).Set(float64(cfg.Sim.TotalKVBlocks * cfg.Sim.BlockSize))
		pageSize.WithLabelValues(values...).Set(float64(cfg.Sim.BlockSize))
		pages.WithLabelValues(values...).Set(float64(cfg.Sim.TotalKVBlocks))
		contextLen.WithLabelValues(values...).Set(float64(cfg.Sim.TotalKVBlocks * cfg.Sim.BlockSize))
	}
}
