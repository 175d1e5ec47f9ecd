package mockworker

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/sim"
)

// metrics are the engine metrics under vLLM's names (vllm/v1/metrics
// loggers.py), in a private registry. Like vLLM, every series is labelled
// model_name and engine (the data-parallel rank, "0" without data
// parallelism), and vllm:cache_config_info is an info gauge (value 1) per
// engine whose labels carry the cache configuration.
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
}

func newMetrics(model string, ranks int, cfg sim.Config) *metrics {
	labels := []string{"model_name", "engine"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	running := gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	waiting := gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	kvUsage := gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	promptTokens := counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	generationTokens := counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	preemptions := counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	cacheQueries := counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	cacheHits := counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
	}, []string{"model_name", "engine", "finished_reason"})
	batches := counter("mock_kv_event_batches_total", "KV event batches published (switchyard mock engine).")
	// vLLM's CacheConfig.metrics_info: every field of the cache config as a
	// label (str() of its value), plus engine. The mock sets the ones it
	// models; num_gpu_blocks and block_size are the simulated engine's.
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
	}, []string{"block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks"})
	m := &metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(running, waiting, kvUsage, promptTokens, generationTokens, preemptions,
		cacheQueries, cacheHits, success, batches, info)
	for r := range ranks {
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
		info.WithLabelValues(strconv.Itoa(cfg.BlockSize), "auto", "True", e, "0.9", "None",
			strconv.Itoa(cfg.TotalKVBlocks)).Set(1)
	}
	return m
}
