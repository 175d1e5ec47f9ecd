package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
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
// it was renamed; SGLang reports sglang:token_usage. Capacity is vLLM's
// vllm:cache_config_info info gauge (its labels are the engine's
// CacheConfig fields, num_gpu_blocks and block_size among them) or
// SGLang's sglang:max_total_num_tokens, with sglang:page_size as SGLang's
// block size.
//
// Each is read in this colon spelling, the engines' own, and in the
// underscore spelling (Underscored: vllm_num_requests_waiting,
// sglang_num_running_reqs) that OpenMetrics' escaping=underscores and
// sgl-router's /engine_metrics produce; the colon spelling wins when an
// answer has both.
const (
	VLLMRunning     = "vllm:num_requests_running"
	VLLMWaiting     = "vllm:num_requests_waiting"
	VLLMKVUsage     = "vllm:kv_cache_usage_perc"
	VLLMGPUKVUsage  = "vllm:gpu_cache_usage_perc"
	VLLMCacheConfig = "vllm:cache_config_info"
	SGLangRunning   = "sglang:num_running_reqs"
	SGLangWaiting   = "sglang:num_queue_reqs"
	SGLangKVUsage   = "sglang:token_usage"
	SGLangMaxTokens = "sglang:max_total_num_tokens"
	SGLangPageSize  = "sglang:page_size"
	maxMetricsBytes = 16 << 20
)

// The engine metrics the Manager watches for a restart (Restarted):
// prometheus_client's process_start_time_seconds (the API server process's
// start, in Unix seconds; vLLM serves it unless --api-server-count > 1)
// and the engines' monotonic counters: vLLM's vllm:prompt_tokens,
// vllm:generation_tokens and vllm:request_success (vllm/v1/metrics/
// loggers.py; prometheus_client exposes a counter with a "_total" suffix),
// SGLang's sglang:prompt_tokens_total, sglang:generation_tokens_total and
// sglang:num_requests_total (metrics_collector.py). Each counter is read in
// both spellings, like the load metrics.
const (
	ProcessStartTime = "process_start_time_seconds"
	VLLMPromptTokens = "vllm:prompt_tokens_total"
	VLLMGenTokens    = "vllm:generation_tokens_total"
	VLLMSuccess      = "vllm:request_success_total"
	SGLangPrompt     = "sglang:prompt_tokens_total"
	SGLangGenTokens  = "sglang:generation_tokens_total"
	SGLangRequests   = "sglang:num_requests_total"
	// MaxCounterSeries bounds the counter series kept from one report
	// (Engine.Counters); the series past it are not watched.
	MaxCounterSeries = 256
	// maxSeriesKeyBytes bounds one counter series' key; a longer one
	// (absurd label values) is not watched.
	maxSeriesKeyBytes = 1024
)

// restartCounters are the counters Restarted compares.
var restartCounters = []string{VLLMPromptTokens, VLLMGenTokens, VLLMSuccess, SGLangPrompt, SGLangGenTokens, SGLangRequests}

// Underscored returns name in the underscore spelling: its first ':'
// replaced by '_' ("sglang:token_usage" -> "sglang_token_usage"), the
// name OpenMetrics' escaping=underscores gives it.
func Underscored(name string) string { return strings.Replace(name, ":", "_", 1) }

// spellings returns each of names in its colon and underscore spelling,
// in order.
func spellings(names ...string) []string {
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		out = append(out, n)
		if u := Underscored(n); u != n {
			out = append(out, u)
		}
	}
	return out
}

// family returns mfs's family name, in its colon spelling else its
// underscore one.
func family(mfs map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf := mfs[name]; len(mf.GetMetric()) > 0 {
		return mf
	}
	return mfs[Underscored(name)]
}

// RankLabel is the label vLLM (V1) puts on each data-parallel engine's
// series: engine="N" for rank N. SGLangRankLabel is SGLang's: with
// --dp-size above 1 every scheduler's series carry dp_rank="N" (its
// SchedulerMetricsCollector labels, python/sglang/srt/observability/
// metrics_collector.py), none without. MaxRanks bounds the ranks read
// from one engine: a series of rank MaxRanks or more is ignored.
const (
	RankLabel       = "engine"
	SGLangRankLabel = "dp_rank"
	MaxRanks        = 1024
	// maxCapacityTokens bounds a reported capacity (2^50 tokens), so that
	// products and conversions never overflow.
	maxCapacityTokens = 1 << 50
)

// Engine is one parsed report of an engine's metrics.
type Engine struct {
	// Ranks are the reports of the engine's data-parallel ranks, in
	// ascending rank order. An engine whose series carry no engine label,
	// or only engine="0", has one rank, 0. Empty when the report holds
	// none of the metrics ParseEngine reads.
	Ranks []Rank
	// Ranked is true when the engine reports data-parallel ranks: its
	// series carry vLLM's engine="N" label, or SGLang's dp_rank="N", with
	// more than one N, or with an N other than 0. Each rank is then a
	// candidate of its own, and a request to it names its rank
	// (X-Data-Parallel-Rank, which vLLM and SGLang both read).
	Ranked bool
	// StartTime is the engine's process_start_time_seconds (Unix
	// seconds; the largest finite sample); 0 when not reported.
	StartTime float64
	// Counters are the engine's monotonic counters (restartCounters), by
	// series: the family's colon name and its label pairs, sorted
	// ("vllm:request_success_total{engine=\"0\",finished_reason=\"stop\"}");
	// at most MaxCounterSeries. Nil when it reports none.
	Counters map[string]float64
}

// Restarted reports whether cur, a later report of the engine that gave
// prev, shows that the engine restarted in between, and why in plain
// words: its process_start_time_seconds increased, or a counter series
// both reports hold went back. A series only one of them holds is not
// compared, so a counter that appears or disappears is no restart; an
// engine restarted whose counters already passed their old values, and
// that reports no start time, is not seen.
func Restarted(prev, cur Engine) (why string, restarted bool) {
	if prev.StartTime > 0 && cur.StartTime > prev.StartTime {
		return fmt.Sprintf("%s went from %.0f to %.0f", ProcessStartTime, prev.StartTime, cur.StartTime), true
	}
	// The smallest key that went back, so that the reason is the same for
	// the same reports.
	var key string
	for k, v := range cur.Counters {
		if p, ok := prev.Counters[k]; ok && v < p && (key == "" || k < key) {
			key = k
		}
	}
	if key != "" {
		return fmt.Sprintf("counter %s went back from %g to %g", key, prev.Counters[key], cur.Counters[key]), true
	}
	return "", false
}

// Rank is one data-parallel rank's part of an engine report.
type Rank struct {
	Rank uint32
	// Load is what the report sets as the rank's engine load; nil when
	// the rank's series hold none of the KV-usage and waiting metrics.
	Load *fleet.EngineLoad
	// Running is the rank's count of running requests (vLLM
	// num_requests_running, SGLang num_running_reqs); HasRunning is false
	// when absent. fleet.EngineLoad has no field for it: it is reported in
	// Status only.
	Running    int64
	HasRunning bool
	// CapacityTokens is the rank's KV-cache capacity in tokens:
	// num_gpu_blocks * block_size of vllm:cache_config_info, or
	// sglang:max_total_num_tokens; 0 when not reported (vLLM reports
	// num_gpu_blocks "None" until its memory profiling ends).
	CapacityTokens int64
	// BlockSize is the engine's KV block size in tokens
	// (cache_config_info's block_size, or sglang:page_size); 0 when not
	// reported.
	BlockSize int64
}

// HasLoad reports whether some rank of the report has a load.
func (e Engine) HasLoad() bool {
	for _, r := range e.Ranks {
		if r.Load != nil {
			return true
		}
	}
	return false
}

// RouterBlocks converts an engine capacity of tokens into router blocks of
// blockSize tokens (docs/design.md): floor(tokens / blockSize); 0 when
// either is unknown (<= 0).
func RouterBlocks(tokens, blockSize int64) int64 {
	if tokens <= 0 || blockSize <= 0 {
		return 0
	}
	return tokens / blockSize
}

// ParseEngine maps the metric families of an engine's /metrics into an
// Engine report, one Rank per data-parallel rank (vLLM's RankLabel,
// SGLang's SGLangRankLabel), each name read in its colon and its
// underscore spelling (Underscored):
//
//   - waiting: vllm:num_requests_waiting, else sglang:num_queue_reqs;
//   - KV usage: vllm:kv_cache_usage_perc, else vllm:gpu_cache_usage_perc,
//     else sglang:token_usage;
//   - running: vllm:num_requests_running, else sglang:num_running_reqs;
//   - capacity: vllm:cache_config_info's num_gpu_blocks * block_size
//     labels, else sglang:max_total_num_tokens (block size
//     sglang:page_size).
//
// A series without the rank label counts for rank 0, except
// cache_config_info's and SGLang's capacity, which apply to every rank
// that reports none of its own (vLLM versions before the label on
// cache_config_info). Within a rank, vLLM's counts are summed over a
// family's series (one per model), rounded and capped at maxCount;
// SGLang's are the largest series: an SGLang server serves one model, and
// its series within a data-parallel rank are its tensor- and
// pipeline-parallel schedulers' (--enable-metrics-for-all-schedulers),
// which report the same queue. SGLang's per-priority breakdowns (a
// priority label other than "", beside the total under priority="") are
// not read. KV usage is the largest series, SGLang's capacity the largest
// of its rank (its tensor-parallel ranks share one pool). KV usage is a
// fraction in 0..1 despite vLLM's "_perc" name; a
// value above 1 is taken as a percentage and divided by 100, and the
// result is clamped to 0..1. NaN and infinite samples are ignored, and
// so are series whose engine label is not a rank below MaxRanks. The
// restart signals (StartTime, Counters) are read too. Work is linear in
// the number of series.
func ParseEngine(mfs map[string]*dto.MetricFamily) Engine {
	p := parser{ranks: map[uint32]*rankAcc{}}
	p.fold(mfs, func(a *rankAcc, v float64, sglang bool) { addCount(&a.waiting, &a.hasWaiting, v, sglang) }, spellings(VLLMWaiting, SGLangWaiting)...)
	p.fold(mfs, func(a *rankAcc, v float64, _ bool) {
		if !a.hasKV || v > a.kv {
			a.kv, a.hasKV = v, true
		}
	}, spellings(VLLMKVUsage, VLLMGPUKVUsage, SGLangKVUsage)...)
	p.fold(mfs, func(a *rankAcc, v float64, sglang bool) { addCount(&a.running, &a.hasRunning, v, sglang) }, spellings(VLLMRunning, SGLangRunning)...)
	p.cacheConfig(family(mfs, VLLMCacheConfig))
	if !p.anyCapacity() {
		p.sglangCapacity(mfs)
	}

	var e Engine
	ranks := make([]uint32, 0, len(p.ranks))
	for r := range p.ranks {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	e.Ranked = p.labelled && (len(ranks) > 1 || len(ranks) == 1 && ranks[0] != 0)
	if len(ranks) == 0 && (p.all.tokens > 0 || p.all.blockSize > 0) {
		ranks = []uint32{0}
		p.ranks[0] = &rankAcc{}
	}
	e.StartTime, e.Counters = restartSignals(mfs)
	for _, r := range ranks {
		a := p.ranks[r]
		out := Rank{Rank: r, CapacityTokens: a.tokens, BlockSize: a.blockSize}
		if out.CapacityTokens == 0 {
			out.CapacityTokens = p.all.tokens
		}
		if out.BlockSize == 0 {
			out.BlockSize = p.all.blockSize
		}
		l := &fleet.EngineLoad{}
		if a.hasWaiting {
			l.Waiting, l.HasWaiting = count(a.waiting), true
		}
		if a.hasKV {
			v := a.kv
			if v > 1 {
				v /= 100
			}
			l.KVUsage, l.HasKVUsage = min(max(v, 0), 1), true
		}
		if l.HasWaiting || l.HasKVUsage {
			out.Load = l
		}
		if a.hasRunning {
			out.Running, out.HasRunning = count(a.running), true
		}
		e.Ranks = append(e.Ranks, out)
	}
	return e
}

// maxCount caps an engine's request counts (waiting, running): 2^31 - 1,
// far past any engine's queue, and small enough that arithmetic on a
// count (a scorer's sums and products) stays in range.
const maxCount = math.MaxInt32

// count is a summed request count as a whole number: rounded, negative
// read as 0, and capped at maxCount, so that a sum past int64 (or +Inf,
// from adding huge samples) never wraps to a negative count, which would
// read as an idle engine.
func count(v float64) int64 {
	return int64(math.Round(min(max(v, 0), maxCount)))
}

// addCount adds a series' count v to a rank's acc: summed (vLLM's series
// per model), or the largest (largest: SGLang's schedulers of one rank).
func addCount(acc *float64, has *bool, v float64, largest bool) {
	switch {
	case !*has:
		*acc = v
	case largest:
		*acc = max(*acc, v)
	default:
		*acc += v
	}
	*has = true
}

// rankAcc accumulates one rank's series.
type rankAcc struct {
	waiting, kv, running          float64
	hasWaiting, hasKV, hasRunning bool
	tokens, blockSize             int64
}

// parser accumulates a report's series by rank.
type parser struct {
	ranks map[uint32]*rankAcc
	// all is the capacity that applies to every rank without its own.
	all rankAcc
	// labelled: some series carried a rank label.
	labelled bool
}

func (p *parser) anyCapacity() bool {
	if p.all.tokens > 0 {
		return true
	}
	for _, a := range p.ranks {
		if a.tokens > 0 {
			return true
		}
	}
	return false
}

// isSGLang reports whether family name is SGLang's ("sglang:…" or
// "sglang_…").
func isSGLang(name string) bool { return strings.HasPrefix(name, "sglang") }

// rankLabel is the label naming the data-parallel rank of family name's
// series: SGLang's dp_rank, else vLLM's engine.
func rankLabel(name string) string {
	if isSGLang(name) {
		return SGLangRankLabel
	}
	return RankLabel
}

// breakdown reports whether m is one of SGLang's per-priority breakdowns
// (a priority label other than ""), not the total.
func breakdown(m *dto.Metric) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == "priority" {
			return lp.GetValue() != ""
		}
	}
	return false
}

// rankOf returns m's rank: its label's value, or 0 and labelled false
// without one; ok is false for a label that is not a rank below MaxRanks.
func rankOf(m *dto.Metric, label string) (rank uint32, labelled, ok bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() != label {
			continue
		}
		n, err := strconv.ParseUint(lp.GetValue(), 10, 32)
		if err != nil || n >= MaxRanks {
			return 0, true, false
		}
		return uint32(n), true, true
	}
	return 0, false, true
}

// acc returns rank's accumulator, creating it.
func (p *parser) acc(rank uint32) *rankAcc {
	a := p.ranks[rank]
	if a == nil {
		a = &rankAcc{}
		p.ranks[rank] = a
	}
	return a
}

// value returns m's finite gauge, untyped or counter value.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0)
}

// fold applies add to each finite sample of the first of names that has
// one, in its series' rank (sglang: an SGLang family); SGLang's
// per-priority breakdowns are skipped.
func (p *parser) fold(mfs map[string]*dto.MetricFamily, add func(a *rankAcc, v float64, sglang bool), names ...string) {
	for _, n := range names {
		found := false
		sglang, label := isSGLang(n), rankLabel(n)
		for _, m := range mfs[n].GetMetric() {
			v, ok := value(m)
			if !ok || sglang && breakdown(m) {
				continue
			}
			rank, labelled, ok := rankOf(m, label)
			if !ok {
				continue
			}
			p.labelled = p.labelled || labelled
			add(p.acc(rank), v, sglang)
			found = true
		}
		if found {
			return
		}
	}
}

// cacheConfig reads vllm:cache_config_info's num_gpu_blocks and block_size
// labels.
func (p *parser) cacheConfig(mf *dto.MetricFamily) {
	for _, m := range mf.GetMetric() {
		var blocks, size int64
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "num_gpu_blocks":
				blocks = positive(lp.GetValue())
			case "block_size":
				size = positive(lp.GetValue())
			}
		}
		rank, labelled, ok := rankOf(m, RankLabel)
		if !ok || size == 0 {
			continue
		}
		a := &p.all
		if labelled {
			p.labelled = true
			a = p.acc(rank)
		}
		a.blockSize = size
		if blocks > 0 && blocks <= maxCapacityTokens/size {
			a.tokens = blocks * size
		}
	}
}

// restartSignals reads mfs's process_start_time_seconds (the largest
// finite sample) and restartCounters' series.
func restartSignals(mfs map[string]*dto.MetricFamily) (start float64, counters map[string]float64) {
	for _, m := range mfs[ProcessStartTime].GetMetric() {
		if v, ok := value(m); ok && v > start {
			start = v
		}
	}
	var b strings.Builder
	for _, name := range restartCounters {
		for _, m := range family(mfs, name).GetMetric() {
			v, ok := value(m)
			if !ok || len(counters) >= MaxCounterSeries {
				continue
			}
			b.Reset()
			b.WriteString(name)
			labels := slices.Clone(m.GetLabel())
			slices.SortFunc(labels, func(x, y *dto.LabelPair) int { return strings.Compare(x.GetName(), y.GetName()) })
			for i, lp := range labels {
				if i == 0 {
					b.WriteByte('{')
				} else {
					b.WriteByte(',')
				}
				b.WriteString(lp.GetName())
				b.WriteString("=")
				b.WriteString(strconv.Quote(lp.GetValue()))
				if b.Len() > maxSeriesKeyBytes {
					break
				}
			}
			if len(labels) > 0 {
				b.WriteByte('}')
			}
			if b.Len() > maxSeriesKeyBytes {
				continue
			}
			if counters == nil {
				counters = make(map[string]float64)
			}
			counters[b.String()] = v
		}
	}
	return start, counters
}

// sglangCapacity reads sglang:max_total_num_tokens and sglang:page_size:
// each rank's largest series (dp_rank), and the largest series without
// the label as the capacity of every rank without its own.
func (p *parser) sglangCapacity(mfs map[string]*dto.MetricFamily) {
	read := func(name string, set func(a *rankAcc, v int64)) {
		for _, m := range family(mfs, name).GetMetric() {
			v, ok := value(m)
			if !ok || v < 1 || v > maxCapacityTokens {
				continue
			}
			rank, labelled, ok := rankOf(m, SGLangRankLabel)
			if !ok {
				continue
			}
			a := &p.all
			if labelled {
				p.labelled = true
				a = p.acc(rank)
			}
			set(a, int64(v))
		}
	}
	read(SGLangMaxTokens, func(a *rankAcc, v int64) { a.tokens = max(a.tokens, v) })
	read(SGLangPageSize, func(a *rankAcc, v int64) { a.blockSize = max(a.blockSize, v) })
}

// positive parses a label value as an integer in 1..maxCapacityTokens; 0
// otherwise ("None", garbage).
func positive(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > maxCapacityTokens {
		return 0
	}
	return n
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
	// ErrModels: the engine's GET /v1/models answered 200 with something
	// that is not an OpenAI model list of 1 to MaxModels models (ids of at
	// most MaxModelBytes bytes), or with more than 4 MiB.
	ErrModels = errors.New("model list unusable")
)

// Bounds of an engine's model list (fetchModels).
const (
	MaxModels      = 4096
	MaxModelBytes  = 512
	maxModelsBytes = 4 << 20
	// MaxRootBytes bounds a model card's root (vLLM: the model's path, or
	// a LoRA adapter's).
	MaxRootBytes = 4096
	// maxModelLen bounds a model card's max_model_len (2^40 tokens); a
	// larger or negative one is read as unknown.
	maxModelLen = 1 << 40
)

// ModelCard is what an engine's GET /v1/models says of one model: vLLM's
// ModelCard (vllm/entrypoints/openai/engine/protocol.py), SGLang's
// likewise. The JSON names are the engines'.
type ModelCard struct {
	// ID is the name requests give the model (the OpenAI "id").
	ID string `json:"id"`
	// Root is the model's source: vLLM gives the base model's path for a
	// base model and the adapter's path for a LoRA adapter; "" when not
	// reported.
	Root string `json:"root,omitempty"`
	// Parent is the base model a LoRA adapter runs on (vLLM's "parent");
	// "" for a base model or when not reported.
	Parent string `json:"parent,omitempty"`
	// MaxModelLen is the model's context length in tokens; 0 when not
	// reported (vLLM gives none for a LoRA adapter).
	MaxModelLen int64 `json:"max_model_len,omitempty"`
	// Raw is the engine's own JSON object for the model, as it listed it
	// (created, owned_by, root, parent, max_model_len, permission...),
	// when it is at most MaxCardBytes; "" otherwise. The router's GET
	// /v1/models lists it as it is.
	Raw string `json:"-"`
}

// MaxCardBytes bounds the JSON object of one model an engine's
// /v1/models lists that a ModelCard keeps (Raw): 16 KiB, several times a
// vLLM model card with its permission list.
const MaxCardBytes = 16 << 10

// fetchModels GETs an engine's OpenAI model list at url and returns its
// models' cards, sorted by id, one per id (the first listed). vLLM lists
// its LoRA adapters there too, with a "parent" naming the base model:
// they are models requests may name, and are kept. The answer is read up
// to 4 MiB, decoded in one pass (linear in its size); see ErrModels. An id
// or parent over MaxModelBytes, or a root over MaxRootBytes, is an error;
// a max_model_len that is not a whole number from 1 to 2^40 is read as
// unknown (0).
func fetchModels(ctx context.Context, c *http.Client, url string, timeout time.Duration) ([]ModelCard, error) {
	resp, err := get(ctx, c, url, "application/json", timeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body := &io.LimitedReader{R: resp.Body, N: maxModelsBytes + 1}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	err = json.NewDecoder(body).Decode(&list)
	switch {
	case body.N == 0:
		return nil, fmt.Errorf("%w: the answer of %s is over %d MiB", ErrModels, url, maxModelsBytes>>20)
	case err != nil && isTimeout(err):
		return nil, fmt.Errorf("%w: the answer of %s took longer than %s", ErrTimeout, url, timeout)
	case err != nil:
		return nil, fmt.Errorf("%w: %s does not answer an OpenAI model list: %s", ErrModels, url, clip(err.Error()))
	case len(list.Data) > MaxModels:
		return nil, fmt.Errorf("%w: %s lists %d models, more than %d", ErrModels, url, len(list.Data), MaxModels)
	}
	cards := make([]ModelCard, 0, len(list.Data))
	for _, raw := range list.Data {
		var d struct {
			ID          string      `json:"id"`
			Root        string      `json:"root"`
			Parent      string      `json:"parent"`
			MaxModelLen json.Number `json:"max_model_len"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, fmt.Errorf("%w: %s does not answer an OpenAI model list: %s", ErrModels, url, clip(err.Error()))
		}
		switch {
		case strings.TrimSpace(d.ID) == "":
			continue
		case len(d.ID) > MaxModelBytes:
			return nil, fmt.Errorf("%w: %s lists a model id of %d bytes, more than %d", ErrModels, url, len(d.ID), MaxModelBytes)
		case len(d.Parent) > MaxModelBytes:
			return nil, fmt.Errorf("%w: %s lists a model parent of %d bytes, more than %d", ErrModels, url, len(d.Parent), MaxModelBytes)
		case len(d.Root) > MaxRootBytes:
			return nil, fmt.Errorf("%w: %s lists a model root of %d bytes, more than %d", ErrModels, url, len(d.Root), MaxRootBytes)
		}
		card := ModelCard{ID: d.ID, Root: d.Root, Parent: d.Parent}
		if len(raw) <= MaxCardBytes && raw[0] == '{' {
			card.Raw = string(raw)
		}
		if n, err := d.MaxModelLen.Int64(); err == nil && n > 0 && n <= maxModelLen {
			card.MaxModelLen = n
		}
		cards = append(cards, card)
	}
	if len(cards) == 0 {
		return nil, fmt.Errorf("%w: %s lists no model", ErrModels, url)
	}
	slices.SortStableFunc(cards, func(a, b ModelCard) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(cards, func(a, b ModelCard) bool { return a.ID == b.ID }), nil
}

// cardIDs returns cards' ids, in order.
func cardIDs(cards []ModelCard) []string {
	ids := make([]string, len(cards))
	for i, c := range cards {
		ids[i] = c.ID
	}
	return ids
}

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
//
// Alongside the metrics it GETs w.URL + "/health": an engine that answers
// it 503 (or any 5xx) is not serving, whatever its metrics say: vLLM's
// /health answers 503 once its engine is dead, a draining engine's does
// (the probe fails with ErrNotServing). Another answer, or none, leaves
// the metrics' verdict.
func probe(ctx context.Context, c *http.Client, w config.Worker, timeout time.Duration) (rep Engine, noLoad string, err error) {
	health := make(chan error, 1)
	go func() { health <- checkHealth(ctx, c, w.URL+"/health", timeout) }()
	rep, noLoad, err = probeMetrics(ctx, c, w, timeout)
	if herr := <-health; herr != nil && err == nil {
		return Engine{}, "", herr
	}
	return rep, noLoad, err
}

// ErrNotServing: the engine's /health answered a 5xx status.
var ErrNotServing = errors.New("not serving")

// checkHealth GETs url and returns ErrNotServing (wrapped) when it answers
// 5xx, nil otherwise.
func checkHealth(ctx context.Context, c *http.Client, url string, timeout time.Duration) error {
	resp, err := get(ctx, c, url, "", timeout)
	if err == nil {
		drain(resp)
		return nil
	}
	var se *StatusError
	if errors.As(err, &se) && se.Code >= 500 {
		return fmt.Errorf("%w: %s answers %d (the engine is draining or dead)", ErrNotServing, url, se.Code)
	}
	return nil
}

// probeMetrics is probe's scrape of the metrics (or /health when they
// answer 404).
func probeMetrics(ctx context.Context, c *http.Client, w config.Worker, timeout time.Duration) (rep Engine, noLoad string, err error) {
	rep, err = scrape(ctx, c, w.MetricsURL, timeout)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
		health := w.URL + "/health"
		resp, herr := get(ctx, c, health, "", timeout)
		if herr != nil {
			return Engine{}, "", fmt.Errorf("%w (and %s answers 404)", herr, w.MetricsURL)
		}
		drain(resp)
		return Engine{}, fmt.Sprintf("%s answers 404 (SGLang serves metrics only with --enable-metrics); ready by %s", w.MetricsURL, health), nil
	}
	if err == nil && !rep.HasLoad() {
		noLoad = w.MetricsURL + " holds no vLLM or SGLang load metrics"
	}
	return rep, noLoad, err
}

// scrape fetches and parses the metrics at url.
func scrape(ctx context.Context, c *http.Client, url string, timeout time.Duration) (Engine, error) {
	resp, err := get(ctx, c, url, promAccept, timeout)
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

// promAccept asks for Prometheus text exposition.
const promAccept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// get GETs url with an Accept header of accept (none when ""); an answer
// other than 200 is a *StatusError (its body drained, up to 4 KiB). Its
// errors say what happened in plain words.
func get(ctx context.Context, c *http.Client, url, accept string, timeout time.Duration) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
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
