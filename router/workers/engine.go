package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	neturl "net/url"
	"syscall"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard-router/switchyard/router/config"
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

// Why a probe failed. A probe's error wraps one of these, or a
// *StatusError, or is another network error ("GET URL: ..."); each reads
// as plain words naming the URL.
var (
	// ErrRefused: nothing listens at the endpoint's address.
	ErrRefused = errors.New("connection refused")
	// ErrTimeout: no whole answer within the scrape interval.
	ErrTimeout = errors.New("timeout")
	// ErrUnparseable: the metrics endpoint answered 200 with something
	// that is not Prometheus text.
	ErrUnparseable = errors.New("metrics unparseable")
	// ErrTooLarge: the metrics endpoint answered more than 16 MiB
	// (maxMetricsBytes), more than any engine's metrics; the answer is
	// not read past that.
	ErrTooLarge = errors.New("metrics too large")
)

// StatusError is an endpoint answering with a status other than 200.
type StatusError struct {
	// URL is the endpoint; Code the HTTP status it answered.
	URL  string
	Code int
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP status %d from %s", e.Code, e.URL) }

// maxReasonBytes bounds the engine-provided text (a parse error quotes the
// engine's input) kept in a probe error.
const maxReasonBytes = 200

// probe is one probe of w's engine within timeout. It scrapes w.MetricsURL
// and returns the report; when the metrics endpoint answers 404 (SGLang
// without --enable-metrics) it GETs w.URL + "/health" instead and, when
// that answers 200, returns an empty report (Load nil). noLoad says why a
// successful probe has no load; "" when it has one.
func probe(ctx context.Context, c *http.Client, w config.Worker, timeout time.Duration) (rep Engine, noLoad string, err error) {
	rep, err = scrape(ctx, c, w.MetricsURL, timeout)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
		health := w.URL + "/health"
		resp, herr := get(ctx, c, health, timeout)
		if herr != nil {
			return Engine{}, "", fmt.Errorf("%w (and %s answers 404)", herr, w.MetricsURL)
		}
		drain(resp)
		return Engine{}, fmt.Sprintf("%s answers 404 (SGLang serves metrics only with --enable-metrics); ready by %s", w.MetricsURL, health), nil
	}
	if err == nil && rep.Load == nil {
		noLoad = w.MetricsURL + " holds no vLLM or SGLang load metrics"
	}
	return rep, noLoad, err
}

// scrape fetches and parses the metrics at url.
func scrape(ctx context.Context, c *http.Client, url string, timeout time.Duration) (Engine, error) {
	resp, err := get(ctx, c, url, timeout)
	if err != nil {
		return Engine{}, err
	}
	defer resp.Body.Close()
	// One byte past the limit tells an answer over it from one at it.
	body := &io.LimitedReader{R: resp.Body, N: maxMetricsBytes + 1}
	e, err := ParseEngineText(body)
	switch {
	case body.N == 0:
		return Engine{}, fmt.Errorf("%w: the answer of %s is over %d MiB", ErrTooLarge, url, maxMetricsBytes>>20)
	case err == nil:
		return e, nil
	case isTimeout(err):
		return Engine{}, fmt.Errorf("%w: the answer of %s took longer than %s", ErrTimeout, url, timeout)
	}
	return Engine{}, fmt.Errorf("%w from %s: %s", ErrUnparseable, url, clip(err.Error()))
}

// get GETs url; an answer other than 200 is a *StatusError (its body
// drained, up to 4 KiB). Its errors say what happened in plain words.
func get(ctx context.Context, c *http.Client, url string, timeout time.Duration) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := c.Do(req)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("%w by %s", ErrRefused, url)
	case isTimeout(err):
		return nil, fmt.Errorf("%w: no answer from %s within %s", ErrTimeout, url, timeout)
	default:
		if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // its message repeats the method and the URL
		}
		return nil, fmt.Errorf("GET %s: %s", url, clip(err.Error()))
	}
	if resp.StatusCode != http.StatusOK {
		drain(resp)
		return nil, &StatusError{URL: url, Code: resp.StatusCode}
	}
	return resp, nil
}

// drain reads up to 4 KiB of resp's body, so its connection may be reused,
// and closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// clip bounds s to maxReasonBytes, on a rune boundary.
func clip(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	i := maxReasonBytes
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}
