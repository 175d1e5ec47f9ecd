package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// TestFastProxyRoundTrip puts case (x)'s proxy in front of two engines
// (httptest servers) and sends a chat request through it per engine: each
// engine gets the body, method, path and its own Host; the client gets
// each engine's status, Content-Type and body back, and the two requests
// go to the two engines in turn.
func TestFastProxyRoundTrip(t *testing.T) {
	const reqBody = `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	type seen struct{ method, path, host, body string }
	got := make(chan seen, 2)
	engine := func(status int, answer string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("engine reading the body: %v", err)
			}
			got <- seen{r.Method, r.URL.Path, r.Host, string(b)}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, answer)
		}))
	}
	okEngine := engine(http.StatusOK, `{"id":"chatcmpl-1","choices":[{"message":{"content":"hello"}}]}`)
	defer okEngine.Close()
	busyEngine := engine(http.StatusTooManyRequests, `{"error":{"message":"busy"}}`)
	defer busyEngine.Close()
	var ups []*url.URL
	for _, e := range []*httptest.Server{okEngine, busyEngine} {
		u, err := url.Parse(e.URL)
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, u)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := fastProxy(ups)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() {
		if err := srv.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-done
	}()

	for i, want := range []struct {
		status int
		body   string
		host   string
	}{
		{http.StatusOK, `{"id":"chatcmpl-1","choices":[{"message":{"content":"hello"}}]}`, ups[0].Host},
		{http.StatusTooManyRequests, `{"error":{"message":"busy"}}`, ups[1].Host},
	} {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(reqBody)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: reading the answer: %v", i, err)
		}
		if resp.StatusCode != want.status || string(b) != want.body {
			t.Errorf("request %d: got %d %q, want %d %q", i, resp.StatusCode, b, want.status, want.body)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("request %d: Content-Type %q, want application/json", i, ct)
		}
		e := <-got
		if e != (seen{http.MethodPost, "/v1/chat/completions", want.host, reqBody}) {
			t.Errorf("request %d: engine saw %+v, want POST /v1/chat/completions to %s with the request's body", i, e, want.host)
		}
	}
}
