package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard-router/switchyard/router/fleet"
)

// The engine metrics the Manager reads. vLLM's KV usage is
// vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc on versions before
// it was renamed; SGLang reports sglang:token_usage.
const (
	VLLMRunning     = "vllm:num_requests_running"
	VLLMWaiting     = "vllm:num_requests_waiting"
	VLLMKVUsage     = "vllm:kv_cache_usage_perc"
	VLLMGPUKVUsage  = "vllm:gpu_cache_usage_perc"
	SGLangRunning   = "sglang:num_running_reqs"
	SGLangWaiting   = "sglang:num_queue_reqs"
	SGLangKVUsage   = "sglang:token_usage"
	maxMetricsBytes = 16 << 20
)

// Engine is one parsed report of an engine's metrics.
type Engine struct {
	// Load is what the report sets as the worker's engine load; nil when
	// the report holds none of the KV-usage and waiting metrics.
	Load *fleet.EngineLoad
	// Running is the engine's count of running requests (vLLM
	// num_requests_running, SGLang num_running_reqs); HasRunning is false
	// when absent. fleet.EngineLoad has no field for it: it is reported in
	// Status only.
	Running    int64
	HasRunning bool
}

// ParseEngine maps the metric families of an engine's /metrics into an
// Engine report:
//
//   - waiting: vllm:num_requests_waiting, else sglang:num_queue_reqs;
//   - KV usage: vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc,
//     else sglang:token_usage;
//   - running: vllm:num_requests_running, else sglang:num_running_reqs.
//
// Counts are summed over a family's series (one per model or
// data-parallel engine) and rounded; KV usage is the largest series (the
// fullest engine). KV usage is a fraction in 0..1 despite vLLM's "_perc"
// name; a value above 1 is taken as a percentage and divided by 100, and
// the result is clamped to 0..1. NaN and infinite samples are ignored.
func ParseEngine(mfs map[string]*dto.MetricFamily) Engine {
	var e Engine
	l := &fleet.EngineLoad{}
	if v, ok := first(mfs, sum, VLLMWaiting, SGLangWaiting); ok {
		l.Waiting, l.HasWaiting = int64(math.Round(max(v, 0))), true
	}
	if v, ok := first(mfs, maxOf, VLLMKVUsage, VLLMGPUKVUsage, SGLangKVUsage); ok {
		if v > 1 {
			v /= 100
		}
		l.KVUsage, l.HasKVUsage = min(max(v, 0), 1), true
	}
	if v, ok := first(mfs, sum, VLLMRunning, SGLangRunning); ok {
		e.Running, e.HasRunning = int64(math.Round(max(v, 0))), true
	}
	if l.HasWaiting || l.HasKVUsage {
		e.Load = l
	}
	return e
}

func sum(a, b float64) float64   { return a + b }
func maxOf(a, b float64) float64 { return max(a, b) }

// first folds the samples of the first of names present with a finite
// sample.
func first(mfs map[string]*dto.MetricFamily, fold func(a, b float64) float64, names ...string) (float64, bool) {
	for _, n := range names {
		mf := mfs[n]
		if mf == nil {
			continue
		}
		var (
			acc float64
			any bool
		)
		for _, m := range mf.GetMetric() {
			var v float64
			switch {
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			default:
				continue
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			if !any {
				acc, any = v, true
			} else {
				acc = fold(acc, v)
			}
		}
		if any {
			return acc, true
		}
	}
	return 0, false
}

// ParseEngineText parses Prometheus text exposition with prometheus/common's
// text parser and maps it with ParseEngine.
func ParseEngineText(r io.Reader) (Engine, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Engine{}, err
	}
	return ParseEngine(mfs), nil
}

// errStatus is a metrics endpoint answering other than 200.
var errStatus = errors.New("metrics endpoint status")

// scrape fetches and parses url within timeout.
func scrape(ctx context.Context, c *http.Client, url string) (Engine, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Engine{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := c.Do(req)
	if err != nil {
		return Engine{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return Engine{}, fmt.Errorf("%w %s", errStatus, resp.Status)
	}
	e, err := ParseEngineText(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return Engine{}, fmt.Errorf("parsing metrics: %w", err)
	}
	return e, nil
}
