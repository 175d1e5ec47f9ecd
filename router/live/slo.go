package live

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
)

// The request headers that set a request's latency targets
// (shared.Request.SLO), read by ParseSLO.
//
// Switchyard's own take a Go duration ("500ms", "1.5s") or a bare number
// of milliseconds ("500"); its on-miss header names what happens when no
// worker is predicted to meet them: "least-late", "wait" or "reject"
// (shared.ParseSLOMiss).
//
// llm-d's predicted-latency scheduling reads x-slo-ttft-ms and
// x-slo-tpot-ms, numbers of milliseconds parsed as floats
// (llm-d/llm-d-inference-scheduler,
// pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/plugin.go,
// TTFTSLOHeaderKey, TPOTSLOHeaderKey and parseFloatHeader; its
// latencyslo admitter and slodeadline queue order read the same; commit
// 520af47896e5f06e43d09aca281a1149187b0ffd): the router takes them as
// they are, so clients written for llm-d need no change. vLLM's own
// routers read no latency-target header (vllm-project/production-stack
// a6c01db05f65f556235413ba8dbcfb0c01132fff and
// vllm-project/semantic-router 3d48f8c9cc0d5b15067ce324a03ec6cc25f192c3
// have none; the semantic router's fleet simulator takes --slo-ttft and
// --slo-tpot flags only). When both spellings of a target are sent,
// Switchyard's wins.
const (
	HeaderSLOTTFT     = "X-Switchyard-Slo-Ttft"
	HeaderSLOTPOT     = "X-Switchyard-Slo-Tpot"
	HeaderSLOOnMiss   = "X-Switchyard-Slo-On-Miss"
	HeaderLLMDSLOTTFT = "X-Slo-Ttft-Ms"
	HeaderLLMDSLOTPOT = "X-Slo-Tpot-Ms"
)

// MaxSLOTarget bounds a latency target a header sets: one hour, far
// beyond any interactive target and below the request timeout's reach.
const MaxSLOTarget = time.Hour

// maxSLOHeaderBytes bounds the length of an SLO header's value the router
// parses; a longer one is refused (it is no duration).
const maxSLOHeaderBytes = 64

// ParseSLO reads a request's latency targets from its headers
// (HeaderSLOTTFT, HeaderSLOTPOT, HeaderSLOOnMiss, and llm-d's
// HeaderLLMDSLOTTFT, HeaderLLMDSLOTPOT); the zero SLO when it sends none.
// A target of 0 sets none (llm-d's reading: an SLO of 0 is no SLO).
// Errors wrap ErrBadRequest and name the header: a value longer than 64
// bytes, one that is not a duration or a number of milliseconds, a
// negative one or one over MaxSLOTarget, an on-miss action that is not
// one of the three. Constant work per header.
func ParseSLO(h http.Header) (shared.SLO, error) {
	var s shared.SLO
	for _, f := range sloHeaders {
		v := h.Get(f.name)
		if v == "" {
			continue
		}
		d, err := sloTarget(f.name, v, f.ms)
		if err != nil {
			return shared.SLO{}, err
		}
		if f.tpot {
			s.TPOT = d
		} else {
			s.TTFT = d
		}
	}
	if v := h.Get(HeaderSLOOnMiss); v != "" {
		m, ok := shared.ParseSLOMiss(strings.ToLower(strings.TrimSpace(v)))
		if !ok {
			return shared.SLO{}, fmt.Errorf("%w: header %s must be \"least-late\", \"wait\" or \"reject\", not \"%s\"",
				ErrBadRequest, strings.ToLower(HeaderSLOOnMiss), untrusted.Text(v, maxSLOHeaderBytes))
		}
		s.OnMiss = m
	}
	return s, nil
}

// sloHeaders are the target headers ParseSLO reads, in order (a later
// one wins): llm-d's (milliseconds only), then the router's own.
var sloHeaders = [...]struct {
	name string
	tpot bool // the TPOT target, else TTFT
	ms   bool // llm-d's: milliseconds only
}{
	{HeaderLLMDSLOTTFT, false, true}, {HeaderLLMDSLOTPOT, true, true},
	{HeaderSLOTTFT, false, false}, {HeaderSLOTPOT, true, false},
}

// sloTarget parses header name's value v: a number of milliseconds, or
// (unless msOnly) a Go duration.
func sloTarget(name, v string, msOnly bool) (time.Duration, error) {
	bad := func() error {
		want := "a duration such as \"500ms\" or a number of milliseconds"
		if msOnly {
			want = "a number of milliseconds"
		}
		return fmt.Errorf("%w: header %s must be %s from 0 to %v, got \"%s\"",
			ErrBadRequest, strings.ToLower(name), want, MaxSLOTarget, untrusted.Text(v, maxSLOHeaderBytes))
	}
	if len(v) > maxSLOHeaderBytes {
		return 0, bad()
	}
	v = strings.TrimSpace(v)
	var d time.Duration
	if ms, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(ms) || ms < 0 || ms > float64(MaxSLOTarget/time.Millisecond) {
			return 0, bad()
		}
		d = time.Duration(ms * float64(time.Millisecond))
	} else {
		if msOnly {
			return 0, bad()
		}
		if d, err = time.ParseDuration(v); err != nil {
			return 0, bad()
		}
		if d < 0 || d > MaxSLOTarget {
			return 0, bad()
		}
	}
	return d, nil
}

// NoHeadroom returns the *shared.NoHeadroomError in err (a selection
// refused because no worker is predicted to meet the request's latency
// targets, its on_miss being reject) and the Retry-After header value a
// face answers it with: its RetryAfter in whole seconds, rounded up, at
// least 1 (RFC 9110, section 10.2.3: delay-seconds); false when err
// holds none.
func NoHeadroom(err error) (*shared.NoHeadroomError, string, bool) {
	var nh *shared.NoHeadroomError
	if !errors.As(err, &nh) || nh == nil {
		return nil, "", false
	}
	secs := int64(1)
	if d := nh.RetryAfter; d > time.Second {
		secs = int64((d + time.Second - 1) / time.Second)
	}
	return nh, strconv.FormatInt(secs, 10), true
}

// CodeSLONoHeadroom is the error code of the 429 both faces answer a
// *shared.NoHeadroomError with (type rate_limit_error).
const CodeSLONoHeadroom = "slo_no_headroom"

// CountRefusal counts err under switchyard_slo_refusals_total{model}
// (label: the model's metrics label) when it is a *shared.NoHeadroomError;
// other errors count nothing.
func (rt *Runtime) CountRefusal(label string, err error) {
	if rt.met == nil {
		return
	}
	if _, _, ok := NoHeadroom(err); ok {
		rt.met.sloRefusals.WithLabelValues(label).Inc()
	}
}

// maxTokensCap bounds Request.MaxTokens (and CompletionRequest.MaxTokens):
// 2^30 tokens, beyond every model's context.
const maxTokensCap = 1 << 30

// maxTokensFields are the body fields that cap a request's output, in
// the order they are read (the later, when set, wins): completions'
// max_tokens; chat's max_tokens and then max_completion_tokens (vLLM's
// build_tok_params prefers max_completion_tokens).
func maxTokensFields(chat bool) []string {
	if chat {
		return []string{"max_tokens", "max_completion_tokens"}
	}
	return []string{"max_tokens"}
}

// maxTokens reads a JSON number's text as a token cap: a non-negative
// integer, at most maxTokensCap; 0 for another number (a fraction, an
// exponent, a negative), which the engine refuses or reads itself.
func maxTokens(num string) int {
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return int(min(n, maxTokensCap))
}
