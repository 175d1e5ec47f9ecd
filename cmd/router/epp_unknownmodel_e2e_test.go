//go:build linux

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/envoysim"
)

// TestEPPHarnessUnknownModel: through envoysim (docs/epp.md's walkthrough:
// a mock worker serving "mock", `router epp`, the harness), a request for a
// model no worker serves or lists is answered as `router serve` answers it,
// 404 invalid_request_error model_not_found "the model \"nope\" does not
// exist: no worker serves it" (live.ModelNotFoundError), where it was 503
// server_error no_worker, which a client retries: for a chat, a pooling and
// an engine utility request, in both modes. GET /v1/models is 404 not_found
// (the EPP does not route it; a gateway's route sends it to the EPP's HTTP
// API). The known model is still picked.
func TestEPPHarnessUnknownModel(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	c := e2eClient(t)
	c.Timeout = time.Minute
	mock := startProc(t, routerBin, "mock-worker", "--listen", "127.0.0.1:0", "--model", "mock", "--speedup", "50", "--engine-block-size", "16")
	e := startEPPProc(t, routerBin, eppPolicyFile(t, workerBlocks([]string{"w"}, map[string]string{"w": mock.url})), "127.0.0.1:0")
	waitMetrics(t, c, e.api, time.Minute, "the worker ready", allReady("w"))
	type apiError struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	do := func(base, method, path, body string) (int, apiError, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		var a apiError
		_ = json.Unmarshal(b, &a)
		return resp.StatusCode, a, string(b)
	}
	const notFound = `the model "nope" does not exist: no worker serves it`
	for _, m := range harnessModes {
		_, base := startHarness(t, envoysim.Config{EPP: e.grpcAddr, Mode: m})
		for _, tc := range []struct{ path, body string }{
			{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`},
			{"/v1/embeddings", `{"model":"nope","input":"hi"}`},
			{"/tokenize", `{"model":"nope","prompt":"hi"}`},
		} {
			code, a, raw := do(base, http.MethodPost, tc.path, tc.body)
			if code != http.StatusNotFound || a.Error.Type != "invalid_request_error" || a.Error.Code != "model_not_found" || a.Error.Message != notFound {
				t.Errorf("%s, POST %s: %d %s\nwant 404 invalid_request_error model_not_found %q", m, tc.path, code, raw, notFound)
			}
		}
		code, a, raw := do(base, http.MethodGet, "/v1/models", "")
		if code != http.StatusNotFound || a.Error.Code != "not_found" || a.Error.Message != "not found: no endpoint GET /v1/models" {
			t.Errorf("%s, GET /v1/models: %d %s\nwant 404 not_found", m, code, raw)
		}
		code, _, raw = do(base, http.MethodPost, "/v1/chat/completions", chatJSON(false, 4, "hello"))
		if code != http.StatusOK {
			t.Errorf("%s, model mock: %d %s, want 200", m, code, raw)
		}
	}
}
