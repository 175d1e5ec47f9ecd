package mockworker

import "github.com/prometheus/client_golang/prometheus"

// metrics are the engine metrics under vLLM's names (vllm/v1/metrics),
// labelled model_name as vLLM labels them, in a private registry.
type metrics struct {
	reg *prometheus.Registry

	running, waiting, kvUsage prometheus.Gauge
	promptTokens              prometheus.Counter
	generationTokens          prometheus.Counter
	preemptions               prometheus.Counter
	cacheQueries, cacheHits   prometheus.Counter
	success                   prometheus.Counter
}

func newMetrics(model string) *metrics {
	labels := prometheus.Labels{"model_name": model}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		reg:              prometheus.NewRegistry(),
		running:          gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:          gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:          gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		promptTokens:     counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:      counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		cacheQueries:     counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		cacheHits:        counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		success: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
			ConstLabels: prometheus.Labels{"model_name": model, "finished_reason": "length"},
		}),
	}
	m.reg.MustRegister(m.running, m.waiting, m.kvUsage, m.promptTokens, m.generationTokens,
		m.preemptions, m.cacheQueries, m.cacheHits, m.success)
	return m
}
