package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/shared"
)

// headroomFilter is the in-test filter type "no-headroom": it records the
// latency targets of each request it sees and refuses, as the slo
// builtin does for on_miss "reject", a request whose OnMiss is reject
// with a *shared.NoHeadroomError (RetryAfter 2.3 s); it keeps every
// candidate of the others.
type headroomFilter struct {
	mu   sync.Mutex
	seen []shared.SLO
}

func (*headroomFilter) Inputs() shared.Inputs { return 0 }

func (f *headroomFilter) Filter(_ context.Context, req *shared.Request, _ *shared.Candidates, _ []bool) error {
	f.mu.Lock()
	f.seen = append(f.seen, req.SLO)
	f.mu.Unlock()
	if req.SLO.OnMiss == shared.SLOMissReject {
		// The policy's own answer: the core does not decide by the
		// policy's fallback instead (router.FallsBack).
		return &shared.NoHeadroomError{RetryAfter: 2300 * time.Millisecond, TTFT: 0.9, TPOT: 0.031}
	}
	return nil
}

func (f *headroomFilter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

func (f *headroomFilter) last() shared.SLO {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.seen) == 0 {
		return shared.SLO{}
	}
	return f.seen[len(f.seen)-1]
}

// TestSLOHeadersAndNoHeadroom runs `router serve`'s daemon (live.Daemon
// with this face) on a policy file whose policy filters with an in-test
// type registered in its catalog, in front of a mock engine: the latency
// targets of a request's headers (ours, llm-d's) and of its queue class
// reach the policy; a *shared.NoHeadroomError is a 429 slo_no_headroom
// with Retry-After in whole seconds rounded up, in the error shape of
// the request's API, counted in switchyard_slo_refusals_total; a
// malformed target header is a 400 naming it.
func TestSLOHeadersAndNoHeadroom(t *testing.T) {
	m, err := mockworker.New(mockworker.Config{Model: "m", Speedup: 200})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m)
	t.Cleanup(func() { hs.Close(); m.Close() })

	filter := &headroomFilter{}
	cat := catalog.Default()
	if err := cat.Register("test", shared.TypeInfo{Name: "no-headroom", Kind: shared.KindFilter, Doc: "test",
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return filter, nil }}); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, fmt.Sprintf(`worker "a" {
  url = %q
}
policy "slo" {
  filter "headroom" {
    type = "no-headroom"
  }
  picker "pick" {
    type = "round-robin"
  }
}
worker_selection {
  aggregated = "slo"
}
queue {
  class "chat" {
    ttft    = "2s"
    tpot    = "50ms"
  }
}
`, hs.URL))
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy, Catalog: cat})
	rd.waitWorkers(t, "a")

	do := func(path, body string, hdr ...string) *http.Response {
		t.Helper()
		resp, err := post(t, context.Background(), rd.base+path, body, hdr...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	chat := chatBody("m", false, "hello")

	// Targets from headers, ours winning over llm-d's field by field;
	// the class's where the headers set none.
	for _, tt := range []struct {
		hdr  []string
		want shared.SLO
	}{
		{nil, shared.SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond}},
		{[]string{"x-slo-ttft-ms", "500", "x-slo-tpot-ms", "20"}, shared.SLO{TTFT: 500 * time.Millisecond, TPOT: 20 * time.Millisecond}},
		{[]string{"x-slo-ttft-ms", "500", "x-switchyard-slo-ttft", "750ms", "x-switchyard-slo-on-miss", "wait"},
			shared.SLO{TTFT: 750 * time.Millisecond, TPOT: 50 * time.Millisecond, OnMiss: shared.SLOMissWait}},
	} {
		resp := do("/v1/chat/completions", chat, tt.hdr...)
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
			t.Fatalf("headers %v: %d %s", tt.hdr, resp.StatusCode, b)
		}
		got := filter.last()
		if got.Waited < 0 || got.Waited > time.Minute {
			t.Errorf("headers %v: Waited %v", tt.hdr, got.Waited)
		}
		got.Waited = 0
		if got != tt.want {
			t.Errorf("headers %v: the policy saw %+v, want %+v", tt.hdr, got, tt.want)
		}
	}

	// Refused: OpenAI's shape on chat, Anthropic's on /v1/messages.
	resp := do("/v1/chat/completions", chat, "x-switchyard-slo-on-miss", "reject")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("refused: %d, Retry-After %q; want 429 and 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	eb := decodeError(t, resp)
	if eb.Type != live.TypeRateLimit || eb.Code != "slo_no_headroom" || !strings.Contains(eb.Message, "best: TTFT 900 ms, TPOT 31.0 ms") {
		t.Errorf("refusal body %+v", eb)
	}
	resp = do("/v1/messages", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`, "x-switchyard-slo-on-miss", "reject")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" ||
		!strings.HasPrefix(string(b), `{"type":"error","error":{"type":"rate_limit_error","message":"no worker is predicted to meet`) {
		t.Errorf("/v1/messages refused: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}

	// A malformed target: 400 naming the header, before any selection.
	before := filter.count()
	resp = do("/v1/chat/completions", chat, "x-slo-ttft-ms", "soon")
	eb = decodeError(t, resp)
	if resp.StatusCode != http.StatusBadRequest || eb.Type != live.TypeInvalidRequest || !strings.Contains(eb.Message, "header x-slo-ttft-ms must be a number of milliseconds") {
		t.Errorf("malformed header: %d %+v", resp.StatusCode, eb)
	}
	if filter.count() != before {
		t.Errorf("the malformed request reached the policy")
	}

	metrics := string(getBody(t, rd.base+"/metrics"))
	if !strings.Contains(metrics, `switchyard_slo_refusals_total{model="m"} 2`) {
		t.Errorf("/metrics lacks 2 SLO refusals of model m:\n%s", grepLines(metrics, "slo_refusals"))
	}
	if !strings.Contains(metrics, `switchyard_requests_total{code="429",model="m"} 2`) {
		t.Errorf("/metrics lacks the 2 refusals as 429s:\n%s", grepLines(metrics, "switchyard_requests_total"))
	}
}

// grepLines returns the lines of s containing sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
