package live

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

func TestParseSLO(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    shared.SLO
	}{
		{"none", nil, shared.SLO{}},
		{"ours as durations", map[string]string{"x-switchyard-slo-ttft": "500ms", "X-Switchyard-Slo-Tpot": "1.5ms", "x-switchyard-slo-on-miss": "reject"},
			shared.SLO{TTFT: 500 * time.Millisecond, TPOT: 1500 * time.Microsecond, OnMiss: shared.SLOMissReject}},
		{"ours as milliseconds", map[string]string{"x-switchyard-slo-ttft": "250", "x-switchyard-slo-tpot": " 20.5 "},
			shared.SLO{TTFT: 250 * time.Millisecond, TPOT: 20500 * time.Microsecond}},
		{"llm-d's", map[string]string{"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "20"},
			shared.SLO{TTFT: 500 * time.Millisecond, TPOT: 20 * time.Millisecond}},
		{"ours win over llm-d's, field by field", map[string]string{"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "20", "x-switchyard-slo-ttft": "2s"},
			shared.SLO{TTFT: 2 * time.Second, TPOT: 20 * time.Millisecond}},
		{"zero is no target", map[string]string{"x-slo-ttft-ms": "0", "x-switchyard-slo-tpot": "0s", "x-switchyard-slo-on-miss": "Least-Late"},
			shared.SLO{OnMiss: shared.SLOMissLeastLate}},
		{"the bound itself", map[string]string{"x-switchyard-slo-ttft": "1h", "x-slo-tpot-ms": "3600000"},
			shared.SLO{TTFT: time.Hour, TPOT: time.Hour}},
		{"wait", map[string]string{"x-switchyard-slo-on-miss": "wait"}, shared.SLO{OnMiss: shared.SLOMissWait}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.headers {
				h.Set(k, v)
			}
			got, err := ParseSLO(h)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ParseSLO = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseSLOBadValues(t *testing.T) {
	tests := []struct{ header, value, words string }{
		{"x-switchyard-slo-ttft", "soon", `header x-switchyard-slo-ttft must be a duration such as "500ms" or a number of milliseconds from 0 to 1h0m0s, got "soon"`},
		{"x-switchyard-slo-ttft", "-5ms", "x-switchyard-slo-ttft"},
		{"x-switchyard-slo-tpot", "-1", "x-switchyard-slo-tpot"},
		{"x-switchyard-slo-tpot", "2h", "x-switchyard-slo-tpot"},
		{"x-switchyard-slo-tpot", "NaN", "x-switchyard-slo-tpot"},
		{"x-switchyard-slo-tpot", "Inf", "x-switchyard-slo-tpot"},
		{"x-slo-ttft-ms", "500ms", `header x-slo-ttft-ms must be a number of milliseconds from 0 to 1h0m0s, got "500ms"`},
		{"x-slo-tpot-ms", "3600001", "x-slo-tpot-ms"},
		{"x-slo-tpot-ms", "1e400", "x-slo-tpot-ms"},
		{"x-switchyard-slo-on-miss", "shed", `header x-switchyard-slo-on-miss must be "least-late", "wait" or "reject", not "shed"`},
		// A long value is refused, and echoed cut.
		{"x-switchyard-slo-ttft", strings.Repeat("9", 10_000), "(10000 bytes)"},
		{"x-switchyard-slo-on-miss", strings.Repeat("x", 10_000), "(10000 bytes)"},
		// Control characters are escaped in the echo.
		{"x-switchyard-slo-ttft", "1\x01s", `got "1\x01s"`},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s=%.12s", tt.header, tt.value), func(t *testing.T) {
			h := http.Header{}
			h.Set(tt.header, tt.value)
			got, err := ParseSLO(h)
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("ParseSLO = %+v, %v; want an ErrBadRequest", got, err)
			}
			if !strings.Contains(err.Error(), tt.words) {
				t.Errorf("error %q does not say %q", err, tt.words)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: the echo is not bounded", len(err.Error()))
			}
		})
	}
}

// TestMaxTokens: both parse paths, and the Responses and Messages
// schemas, read the request's output cap alike; chat's
// max_completion_tokens wins over max_tokens as vLLM's build_tok_params
// takes it; a field of another JSON type is a 400 naming it.
func TestMaxTokens(t *testing.T) {
	tests := []struct {
		api  API
		body string
		want int
	}{
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 0},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64}`, 64},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":32}`, 32},
		{APIChat, `{"model":"m","max_completion_tokens":32,"messages":[{"role":"user","content":"hi"}],"max_tokens":64}`, 32},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"max_completion_tokens":null}`, 64},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1.5}`, 0},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-3}`, 0},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":99999999999999}`, maxTokensCap},
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"max_tokens":9}`, 9},
		{APICompletions, `{"model":"m","prompt":"hi","max_tokens":16}`, 16},
		// Not a completions field: ignored, whatever its type.
		{APICompletions, `{"model":"m","prompt":"hi","max_completion_tokens":"x","max_tokens":16}`, 16},
		{APIResponses, `{"model":"m","input":"hi","max_output_tokens":100}`, 100},
		{APIMessages, `{"model":"m","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`, 1024},
	}
	for _, tt := range tests {
		t.Run(tt.api.String()+" "+tt.body, func(t *testing.T) {
			req, err := ParseRequest([]byte(tt.body), tt.api)
			if err != nil {
				t.Fatal(err)
			}
			if req.MaxTokens != tt.want {
				t.Errorf("ParseRequest: MaxTokens %d, want %d", req.MaxTokens, tt.want)
			}
			if tt.api == APIChat || tt.api == APICompletions {
				std, err := parseStd([]byte(tt.body), tt.api == APIChat)
				if err != nil {
					t.Fatal(err)
				}
				if std.MaxTokens != tt.want {
					t.Errorf("parseStd: MaxTokens %d, want %d", std.MaxTokens, tt.want)
				}
			}
		})
	}
	for _, bad := range []struct {
		chat        bool
		body, field string
	}{
		{true, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"64"}`, `"max_tokens" must not be a JSON string`},
		{true, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":[1]}`, `"max_completion_tokens" must not be a JSON array`},
		{false, `{"model":"m","prompt":"hi","max_tokens":true}`, `"max_tokens" must not be a JSON bool`},
	} {
		for name, parse := range map[string]func([]byte, bool) (*CompletionRequest, error){"fast": parseFast, "std": parseStd} {
			_, err := parse([]byte(bad.body), bad.chat)
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), bad.field) {
				t.Errorf("%s %s: %v, want a 400 saying %s", name, bad.body, err, bad.field)
			}
		}
	}
}

func TestNoHeadroomRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		after time.Duration
		want  string
	}{{time.Nanosecond, "1"}, {0, "1"}, {time.Second, "1"}, {time.Second + time.Nanosecond, "2"}, {2500 * time.Millisecond, "3"}, {10 * time.Second, "10"}} {
		err := fmt.Errorf("request %q: %w", "r1", &shared.NoHeadroomError{RetryAfter: tt.after, TTFT: 0.9, TPOT: 0.05})
		nh, got, ok := NoHeadroom(err)
		if !ok || nh == nil || got != tt.want {
			t.Errorf("NoHeadroom(RetryAfter %v) = %v, %q, %v; want %q", tt.after, nh, got, ok, tt.want)
		}
	}
	if _, _, ok := NoHeadroom(errors.New("other")); ok {
		t.Error("NoHeadroom of another error: true")
	}
}
