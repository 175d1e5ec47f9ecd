package live

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/admission"
)

// metrics are the server's Prometheus series.
type metrics struct {
	requests  *prometheus.CounterVec   // model, code
	duration  *prometheus.HistogramVec // model
	ttft      *prometheus.HistogramVec // model
	selection *prometheus.HistogramVec // policy, role
	tokenize  *prometheus.HistogramVec // model
	tokFails  *prometheus.CounterVec   // model
	belief    *prometheus.CounterVec   // mode, result
	// promptMatch counts answers by how the router's token count of the
	// prompt compared with the engine's usage.prompt_tokens.
	promptMatch *prometheus.CounterVec // model, result
	// Tokens of the engines' answers' usage, by model.
	promptTokens, cachedTokens, completionTokens *prometheus.CounterVec
	// sloRefusals counts requests refused because no worker was
	// predicted to meet their latency targets (CountRefusal).
	sloRefusals *prometheus.CounterVec // model
}

// latencyBuckets span 5ms to about 10 minutes.
var latencyBuckets = prometheus.ExponentialBuckets(0.005, 2, 18)

// selectionBuckets span 1us to about 4s: a hosted pick takes
// microseconds, a plugin call milliseconds.
var selectionBuckets = prometheus.ExponentialBuckets(1e-6, 4, 12)

func newMetrics(reg prometheus.Registerer, adm *admission.Controller) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_requests_total",
			Help: "Completion requests by model and HTTP status (499: the client left first).",
		}, []string{"model", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_request_duration_seconds",
			Help:    "Completion request duration, from the request's arrival to the answer's last byte.",
			Buckets: latencyBuckets,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_time_to_first_token_seconds",
			Help:    "Streamed requests: time from arrival to the first byte of the engine's answer.",
			Buckets: latencyBuckets,
		}, []string{"model"}),
		selection: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_selection_duration_seconds",
			Help:    "Time in admission (classification and worker selection) per attempt, by policy and role.",
			Buckets: selectionBuckets,
		}, []string{"policy", "role"}),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_tokenize_duration_seconds",
			Help:    "Time to tokenize a prompt for its routing key, for models with a tokenizer block (failures included).",
			Buckets: selectionBuckets,
		}, []string{"model"}),
		tokFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_tokenize_failures_total",
			Help: "Prompts whose tokenizer failed (an engine's /tokenize unreachable or refusing, a chat template error) or that were over its size limit; they were keyed by character blocks.",
		}, []string{"model"}),
		belief: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_prefix_belief_total",
			Help: "Answers of token-keyed requests whose engine reported cached_tokens, by how the prefix index's belief of the chosen worker's cached prefix compared with it: mode precise (the worker's KV events, when live) or approximate (what the router sent), result exact, over or under.",
		}, []string{"mode", "result"}),
		promptMatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_prompt_token_match_total",
			Help: "Answers whose engine reported usage.prompt_tokens, by model and by how the router's token count of the prompt compared with it: exact, over (the router counted more), under, or unknown (the prompt was keyed by characters: the router had no token ids to count).",
		}, []string{"model", "result"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_prompt_tokens_total",
			Help: "Prompt tokens of the answered requests, by model, from the engines' usage (usage.prompt_tokens; a stream's only when the client asked for its usage).",
		}, []string{"model"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_cached_prompt_tokens_total",
			Help: "Prompt tokens the engines served from their prefix cache, by model (usage.prompt_tokens_details.cached_tokens).",
		}, []string{"model"}),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_completion_tokens_total",
			Help: "Completion tokens of the answered requests, by model (usage.completion_tokens).",
		}, []string{"model"}),
		sloRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_slo_refusals_total",
			Help: "Requests refused with 429 (slo_no_headroom) because no worker was predicted to meet their latency targets and their on_miss is reject, by model.",
		}, []string{"model"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.ttft, m.selection, m.tokenize, m.tokFails, m.belief, m.promptMatch, m.promptTokens, m.cachedTokens, m.completionTokens, m.sloRefusals, &queueDepth{adm: adm}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// queueDepth collects switchyard_queue_depth{class} from the Router's
// queues at scrape time.
type queueDepth struct{ adm *admission.Controller }

var queueDepthDesc = prometheus.NewDesc("switchyard_queue_depth",
	"Requests waiting for worker capacity, by queue class.", []string{"class"}, nil)

func (q *queueDepth) Describe(ch chan<- *prometheus.Desc) { ch <- queueDepthDesc }

func (q *queueDepth) Collect(ch chan<- prometheus.Metric) {
	for _, d := range q.adm.WaitingByClass(nil) {
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(d.Waiting), d.Class)
	}
}
