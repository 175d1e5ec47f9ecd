package sidecar

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-router/switchyard/router/epp"
)

// stub is an engine answering every request with status and body, and
// recording the requests' paths, bodies and prefill headers.
type stub struct {
	*httptest.Server
	mu    sync.Mutex
	seen  []string // path + " " + body
	heads []string // the x-prefiller-host-port each request had
}

func newStub(t *testing.T, status int, answer string) *stub {
	t.Helper()
	s := &stub{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, r.URL.Path+" "+string(b))
		s.heads = append(s.heads, r.Header.Get(epp.PrefillHeader))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *stub) requests() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...), append([]string(nil), s.heads...)
}

func hp(s *stub) string { return strings.TrimPrefix(s.URL, "http://") }

// TestSidecarErrors: each refusal in its endpoint's error shape, the
// engine not reached; a non-2xx prefill answer passed through as it is.
func TestSidecarErrors(t *testing.T) {
	good := newStub(t, 200, `{"id":"p","kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[1]}}`)
	noKV := newStub(t, 200, `{"id":"p","kv_transfer_params":null}`)
	busy := newStub(t, 429, `{"error":{"message":"busy","type":"rate_limit_error","code":"429"}}`)
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	for _, tc := range []struct {
		name, path, header, body string
		status                   int
		want                     string // in the answer's body
	}{
		{"no port", "/v1/chat/completions", "10.0.0.1", chat, 400, `"code":"bad_prefill_endpoint"`},
		{"port 0", "/v1/chat/completions", "127.0.0.1:0", chat, 400, `want host:port`},
		{"outside the allow list", "/v1/chat/completions", "10.9.9.9:80", chat, 403, `not an allowed prefill endpoint`},
		{"a name", "/v1/chat/completions", "localhost:80", chat, 403, `not an allowed prefill endpoint`},
		{"not an object", "/v1/completions", hp(good), `[1,2]`, 400, `not a JSON object`},
		{"too large", "/v1/completions", hp(good), `{"prompt":"` + strings.Repeat("a", 2000) + `"}`, 413, `"code":"body_too_large"`},
		{"no kv_transfer_params", "/v1/chat/completions", hp(noKV), chat, 502, `"code":"bad_prefill_answer"`},
		{"prefill refuses", "/v1/chat/completions", hp(busy), chat, 429, `"message":"busy"`},
		{"messages shape", "/v1/messages", hp(noKV), `{"model":"m","max_tokens":3,"messages":[]}`, 502, `"type":"api_error"},"type":"error"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := newStub(t, 200, `{}`)
			u, _ := url.Parse(engine.URL)
			h, err := New(Config{Engine: u, MaxBodyBytes: 1024, AllowPrefill: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			req.Header.Set(epp.PrefillHeader, tc.header)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
				t.Errorf("answer %d %s, want %d with %s", w.Code, w.Body.String(), tc.status, tc.want)
			}
			if seen, _ := engine.requests(); len(seen) != 0 {
				t.Errorf("the engine got %q", seen)
			}
		})
	}
}

// TestSidecarMessagesErrorShape: /v1/messages refusals are in
// Anthropic's shape.
func TestSidecarMessagesErrorShape(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	h, err := New(Config{Engine: u})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{}`))
	req.Header.Set(epp.PrefillHeader, "bad")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type, Message string
		} `json:"error"`
	}
	if w.Code != 400 || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" ||
		!strings.Contains(e.Error.Message, "want host:port") {
		t.Errorf("answer %d %s, want Anthropic's error shape", w.Code, w.Body.String())
	}
}

// TestSidecarPassThrough: without the header, or on a path that is not a
// generation endpoint, or for a GET, the request goes to the engine as it
// came, and the header never reaches it.
func TestSidecarPassThrough(t *testing.T) {
	engine := newStub(t, 200, `{"ok":true}`)
	prefill := newStub(t, 200, `{"kv_transfer_params":{"x":1}}`)
	u, _ := url.Parse(engine.URL)
	h, err := New(Config{Engine: u})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tc := range []struct{ method, path, header string }{
		{"POST", "/v1/chat/completions", ""},
		{"POST", "/v1/embeddings", hp(prefill)},
		{"GET", "/v1/models", hp(prefill)},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, bytes.NewReader([]byte(`{"model":"m"}`)))
		if tc.header != "" {
			req.Header.Set(epp.PrefillHeader, tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != `{"ok":true}` {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, resp.StatusCode, b)
		}
	}
	seen, heads := engine.requests()
	want := []string{`/v1/chat/completions {"model":"m"}`, `/v1/embeddings {"model":"m"}`, `/v1/models {"model":"m"}`}
	if strings.Join(seen, "|") != strings.Join(want, "|") || strings.Join(heads, "") != "" {
		t.Errorf("engine saw %q with headers %q, want %q and no prefill header", seen, heads, want)
	}
	if p, _ := prefill.requests(); len(p) != 0 {
		t.Errorf("the prefill endpoint got %q", p)
	}
}

// TestSidecarTwoHops: the prefill request and the decode request, exactly
// (first entry of a listed header; Responses' output bound).
func TestSidecarTwoHops(t *testing.T) {
	engine := newStub(t, 200, `{"done":true}`)
	prefill := newStub(t, 200, `{"id":"r","kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[4,5]}}`)
	u, _ := url.Parse(engine.URL)
	h, err := New(Config{Engine: u})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"model":"m","input":"hi","max_output_tokens":9,"stream":true}`))
	req.Header.Set(epp.PrefillHeader, hp(prefill)+", 127.0.0.1:1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 200 || w.Body.String() != `{"done":true}` || w.Header().Get(PrefillEndpointHeader) != hp(prefill) {
		t.Fatalf("answer %d %s (prefill %q)", w.Code, w.Body.String(), w.Header().Get(PrefillEndpointHeader))
	}
	p, _ := prefill.requests()
	wantP := `/v1/responses {"input":"hi","kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"max_output_tokens":1,"model":"m","stream":false}`
	if len(p) != 1 || p[0] != wantP {
		t.Errorf("prefill got %q\nwant %q", p, wantP)
	}
	d, heads := engine.requests()
	wantD := `/v1/responses {"input":"hi","kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[4,5]},"max_output_tokens":9,"model":"m","stream":true}`
	if len(d) != 1 || d[0] != wantD || heads[0] != "" {
		t.Errorf("decode got %q (header %q)\nwant %q", d, heads, wantD)
	}
}
