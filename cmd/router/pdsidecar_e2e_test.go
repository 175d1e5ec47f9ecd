package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/envoysim"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/epp/sidecar"
)

// promptTokensOf reads a mock engine's vllm:prompt_tokens_total for model
// "mock" (0 when it has no such series yet).
func promptTokensOf(t *testing.T, engineURL string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(httpGet(t, engineURL+"/metrics"), "\n") {
		if strings.HasPrefix(line, "vllm:prompt_tokens_total{") && strings.Contains(line, `model_name="mock"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

// TestPDSidecarE2E: a disaggregated fleet of real processes behind the
// Envoy stand-in: `router mock-worker` as the prefill engine and as the
// decode engine, `router pd-sidecar --prefill-allow 127.0.0.1` in front
// of the decode engine, `router epp` over a policy file naming the
// prefill engine (role prefill) and the sidecar (role decode). A streamed
// chat request through the gateway is prefilled on the prefill engine
// (its prompt tokens counted there, none on the decode engine) and
// decoded through the sidecar, all its tokens streamed; the sidecar
// refuses a prefill endpoint outside --prefill-allow with 403, and exits
// 0 on SIGTERM.
func TestPDSidecarE2E(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	ms := startMocks(t, routerBin, 2, "50")
	prefill, decode := ms[0], ms[1]
	sc := startProc(t, routerBin, "pd-sidecar", "--listen", "127.0.0.1:0", "--engine", decode.url, "--prefill-allow", "127.0.0.1")
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	writeAtomic(t, policy, `worker "p" {
  url             = "`+prefill.url+`"
  role            = "prefill"
  models          = ["mock"]
  total_kv_blocks = 27500
}
worker "d" {
  url             = "`+sc.url+`"
  role            = "decode"
  models          = ["mock"]
  total_kv_blocks = 27500
}
`)
	p, _ := startEPP(t, routerBin, "--policy", policy)
	proxy, err := envoysim.New(envoysim.Config{EPP: strings.TrimPrefix(p.url, "grpc://"), Mode: envoysim.FullDuplex})
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(proxy)
	t.Cleanup(func() { gw.CloseClientConnections(); gw.Close(); _ = proxy.Close() })

	body := []byte(`{"model":"mock","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("the tide comes in ", 60) + `"}]}`)
	var resp *http.Response
	var data []byte
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err = http.Post(gw.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		// 503 no_worker until both workers are probed ready.
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s\n%s", resp.StatusCode, data, p.stderr.String())
	}
	wantPrefill, _ := epp.Endpoint(prefill.url)
	wantDecode, _ := epp.Endpoint(sc.url)
	if got := resp.Header.Get(sidecar.PrefillEndpointHeader); got != wantPrefill {
		t.Errorf("prefilled at %q, want the prefill engine %q", got, wantPrefill)
	}
	if got := resp.Header.Get(envoysim.UpstreamHeader); got != wantDecode {
		t.Errorf("routed to %q, want the decode sidecar %q", got, wantDecode)
	}
	var tokens int
	for line := range strings.SplitSeq(string(data), "\n") {
		ev, ok := strings.CutPrefix(line, "data: ")
		if !ok || ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != "" {
			tokens++
		}
	}
	if tokens != 5 || !strings.Contains(string(data), "data: [DONE]") {
		t.Errorf("%d content events, want the 5 tokens and [DONE]: %s", tokens, data)
	}
	if got := promptTokensOf(t, prefill.url); got == 0 {
		t.Error("the prefill engine computed no prompt tokens")
	}
	if got := promptTokensOf(t, decode.url); got != 0 {
		t.Errorf("the decode engine computed %v prompt tokens, want 0 (its KV came by transfer)", got)
	}

	// A prefill endpoint outside --prefill-allow, sent to the sidecar
	// directly: 403, in the OpenAI shape, and nothing sent.
	req, _ := http.NewRequest(http.MethodPost, sc.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set(epp.PrefillHeader, "10.1.2.3:8000")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := io.ReadAll(r2.Body)
	_ = r2.Body.Close()
	var e struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	if r2.StatusCode != http.StatusForbidden || json.Unmarshal(b2, &e) != nil || e.Error.Code != "bad_prefill_endpoint" ||
		!strings.Contains(e.Error.Message, "10.1.2.3:8000") {
		t.Errorf("disallowed prefill endpoint: %d %s, want 403 bad_prefill_endpoint naming it", r2.StatusCode, b2)
	}
	sc.stop(t)
	if code := sc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("router pd-sidecar exited %d after SIGTERM, want 0\n%s", code, sc.stderr.String())
	}
}
