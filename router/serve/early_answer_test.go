package serve

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// refusingEngine is an engine on a real loopback socket that answers
// every request from its head alone, before it reads the body, and closes
// the connection with the body unread: vLLM's --api-key check (401
// {"error": "Unauthorized"}, vllm/entrypoints/openai/server_utils.py
// AuthenticationMiddleware, commit
// 029329a8eded26d05ef8d4a302a6c9f318817dd8) or FastAPI's unknown path
// (404 {"detail": "Not Found"}). requests counts the requests it saw.
func refusingEngine(t *testing.T, status int, answer string) (url string, requests *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	requests = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				requests.Add(1)
				fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
					status, http.StatusText(status), len(answer), answer)
			})
		}
	})
	return "http://" + ln.Addr().String(), requests
}

// An engine that refuses a request before reading its (large) body and
// closes the connection gives the client its own answer through the
// router, and is not reported failed: a 4xx is the engine's verdict on
// the request. Before, the router saw only the failed write ("broken
// pipe"), reported the worker failed, tried the next one and answered
// 502 worker_failed, until every worker was marked not ready.
func TestServeEngineAnswerBeforeBodyIsPassedThrough(t *testing.T) {
	const notFound = `{"detail":"Not Found"}`
	const unauthorized = `{"error":"Unauthorized"}`
	urlA, reqA := refusingEngine(t, http.StatusNotFound, notFound)
	urlB, reqB := refusingEngine(t, http.StatusNotFound, notFound)
	e := newEnv(t, envOptions{}, backend{name: "a", url: urlA}, backend{name: "b", url: urlB})
	prompt := strings.Repeat("a", 4<<20)
	tokenize := fmt.Sprintf(`{"model":"m","prompt":%q}`, prompt)

	check := func(base, path, body string, status int, answer string) error {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != status || string(got) != answer {
			return fmt.Errorf("POST %s: %d %s; want the engine's %d %s", path, resp.StatusCode, got, status, answer)
		}
		if w := resp.Header.Get("X-Switchyard-Worker"); w != "a" && w != "b" {
			return fmt.Errorf("POST %s: X-Switchyard-Worker %q, want a or b", path, w)
		}
		return nil
	}
	const sequential = 4
	for range sequential {
		if err := check(e.url, "/tokenize", tokenize, http.StatusNotFound, notFound); err != nil {
			t.Fatal(err)
		}
	}
	// Concurrent large bodies (eight 15 MiB bodies at once marked every
	// worker not ready).
	const concurrent = 4
	var wg sync.WaitGroup
	errs := make(chan error, concurrent)
	for range concurrent {
		wg.Go(func() { errs <- check(e.url, "/tokenize", tokenize, http.StatusNotFound, notFound) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := reqA.Load() + reqB.Load(); n != sequential+concurrent {
		t.Fatalf("the engines saw %d requests, want %d: each request reaches one engine once", n, sequential+concurrent)
	}
	if fa, fb := e.ws.failuresOf("a"), e.ws.failuresOf("b"); fa != 0 || fb != 0 {
		t.Fatalf("failures reported: a %d, b %d; want 0 (a 404 is the engine's answer)", fa, fb)
	}

	// A generation request the engine refuses (vLLM with --api-key, the
	// router without the key) goes the admitted path: the same.
	urlC, reqC := refusingEngine(t, http.StatusUnauthorized, unauthorized)
	g := newEnv(t, envOptions{}, backend{name: "a", url: urlC})
	chat := chatBody("m", false, strings.Repeat("b", 4<<20))
	if err := check(g.url, "/v1/chat/completions", chat, http.StatusUnauthorized, unauthorized); err != nil {
		t.Fatal(err)
	}
	if n, f := reqC.Load(), g.ws.failuresOf("a"); n != 1 || f != 0 {
		t.Fatalf("engine requests %d, failures reported %d; want 1 and 0", n, f)
	}
	g.settle(t)
}
