package sidecar_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/internal/envoysim"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/epp/sidecar"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/mockworker"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// engine is a mock engine on loopback recording the requests it answered.
type engine struct {
	*httptest.Server
	id string

	mu    sync.Mutex
	calls []call
}

type call struct {
	path   string
	header http.Header
	body   []byte
	answer []byte
}

type tee struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (t *tee) Write(b []byte) (int, error) { t.buf.Write(b); return t.ResponseWriter.Write(b) }
func (t *tee) Flush()                      { t.ResponseWriter.(http.Flusher).Flush() }

func newEngine(t *testing.T, id string) *engine {
	t.Helper()
	m, err := mockworker.New(mockworker.Config{Speedup: 50, BlockTokens: 16, EngineID: id})
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{id: id}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		tw := &tee{ResponseWriter: w}
		m.ServeHTTP(tw, r)
		if r.Method == http.MethodPost {
			e.mu.Lock()
			e.calls = append(e.calls, call{r.URL.Path, r.Header.Clone(), body, tw.buf.Bytes()})
			e.mu.Unlock()
		}
	}))
	t.Cleanup(func() { e.CloseClientConnections(); e.Close(); m.Close() })
	return e
}

func (e *engine) posts() []call {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

// promptTokens reads the engine's vllm:prompt_tokens_total (the prompt
// tokens it computed), summed over its series.
func (e *engine) promptTokens(t *testing.T) float64 {
	t.Helper()
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var sum float64
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "vllm:prompt_tokens_total{") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
	}
	return sum
}

func hostport(t *testing.T, u string) string {
	t.Helper()
	ep, err := epp.Endpoint(u)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// pdFleet is a disaggregated fleet behind the Envoy stand-in: prefill
// engines, decode engines each behind its sidecar, the EPP over a
// runtime whose policy file names the prefill engines (role prefill)
// and the sidecars (role decode).
type pdFleet struct {
	r        *router.Router
	prefill  []*engine
	decode   []*engine
	sidecars []string // the decode workers' endpoints, decode[i]'s sidecar
	gateway  map[envoysim.Mode]string
}

func newPDFleet(t *testing.T, nPrefill, nDecode int) *pdFleet {
	t.Helper()
	f := &pdFleet{gateway: map[envoysim.Mode]string{}}
	var policy strings.Builder
	policy.WriteString(`router {
  block_size = 16
}

policy "kv" {
  scorer "cost" {
    type = "kv-cost"
  }
  picker "pick" {
    type        = "min-cost"
    temperature = 0
  }
}

worker_selection {
  prefill = "kv"
  decode  = "kv"
}
`)
	for i := range nPrefill {
		e := newEngine(t, fmt.Sprintf("prefill-%d", i))
		f.prefill = append(f.prefill, e)
		fmt.Fprintf(&policy, "\nworker \"p%d\" {\n  url = %q\n  role = \"prefill\"\n  models = [\"m\"]\n  total_kv_blocks = 1000\n}\n", i, e.URL)
	}
	for i := range nDecode {
		e := newEngine(t, fmt.Sprintf("decode-%d", i))
		f.decode = append(f.decode, e)
		u, _ := url.Parse(e.URL)
		h, err := sidecar.New(sidecar.Config{Engine: u})
		if err != nil {
			t.Fatal(err)
		}
		sc := httptest.NewServer(h)
		t.Cleanup(func() { sc.CloseClientConnections(); sc.Close() })
		f.sidecars = append(f.sidecars, hostport(t, sc.URL))
		fmt.Fprintf(&policy, "\nworker \"d%d\" {\n  url = %q\n  role = \"decode\"\n  models = [\"m\"]\n  total_kv_blocks = 1000\n}\n", i, sc.URL)
	}
	path := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(policy.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	r, err := router.New(router.Options{Bundle: b.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	f.r = r
	mgr, err := workers.NewManager(r, workers.Options{ScrapeInterval: 250 * time.Millisecond, BlockSize: r.BlockSize()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	if err := mgr.Sync(b.Workers()); err != nil {
		t.Fatal(err)
	}
	rt, err := live.New(live.Options{Router: r, Queue: b.Queue(), Workers: mgr, DispatchInterval: 5 * time.Millisecond, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rt.Dispatcher(ctx) }()
	t.Cleanup(func() { cancel(); <-done; rt.Close() })

	// The EPP on a real gRPC listener, the stand-in in front of it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(epp.GRPCServerOptions(live.DefaultMaxBodyBytes)...)
	epp.Register(gs, &epp.Server{Picker: &epp.RouterPicker{Runtime: rt, Fallbacks: 1}})
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-served })
	for _, mode := range []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex} {
		p, err := envoysim.New(envoysim.Config{EPP: ln.Addr().String(), Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(p)
		t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); _ = p.Close() })
		f.gateway[mode] = hs.URL
	}
	deadline := time.Now().Add(time.Minute)
	for len(r.Workers("m", shared.RolePrefill)) < nPrefill || len(r.Workers("m", shared.RoleDecode)) < nDecode {
		if time.Now().After(deadline) {
			t.Fatalf("workers not ready after a minute: %+v", mgr.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return f
}

// active is the bookings of every worker, prefill and decode.
func (f *pdFleet) active() int64 {
	var n int64
	for _, role := range []shared.Role{shared.RolePrefill, shared.RoleDecode} {
		for _, w := range f.r.Workers("m", role) {
			n += w.ActiveRequests()
		}
	}
	return n
}

// post sends body to path through the gateway and returns the answer and
// its body.
func post(t *testing.T, base, path string, body map[string]any, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

func kvOf(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var v struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return v.KV
}

// TestDisaggregatedThroughTheGateway: a disaggregated model behind the
// Envoy stand-in, in both body modes. The EPP picks a prefill worker and
// a decode worker by their roles' policies and routes the request to the
// decode worker's sidecar with x-prefiller-host-port naming the prefill
// engine; the sidecar sends the prefill request there (kv_transfer_params
// do_remote_decode, one token, not streamed) and the client's request,
// with exactly the kv_transfer_params the prefill engine answered, to its
// engine. The prompt is computed on the prefill engine only (the decode
// engine counts 0 prompt tokens), every answer is whole, a header the
// client forged is replaced, and the bookings of both hops return to 0.
// The same holds for the Responses API (its output bounded by
// max_output_tokens, its stream ending with response.completed) and
// Anthropic Messages (max_tokens, Anthropic's events), whose mock engines
// take and answer kv_transfer_params as vLLM's do.
func TestDisaggregatedThroughTheGateway(t *testing.T) {
	f := newPDFleet(t, 2, 2)
	prefillAt := map[string]*engine{}
	for _, e := range f.prefill {
		prefillAt[hostport(t, e.URL)] = e
	}
	decodeAt := map[string]*engine{}
	for i, ep := range f.sidecars {
		decodeAt[ep] = f.decode[i]
	}
	n := 0
	for _, mode := range []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex} {
		for _, stream := range []bool{false, true} {
			for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"} {
				n++
				prompt := fmt.Sprintf("request %d: %s", n, strings.Repeat("tell me about the sea and its tides ", 40))
				// The output bound, the usage's count of it and the
				// stream's end, in the API's own fields.
				bound, used, end := "max_tokens", `"completion_tokens":6`, "data: [DONE]"
				body := map[string]any{"model": "m", "stream": stream}
				switch path {
				case "/v1/completions":
					body["prompt"] = prompt
				case "/v1/responses":
					body["input"] = prompt
					bound, used, end = "max_output_tokens", `"output_tokens":6`, "event: response.completed"
				case "/v1/messages":
					used = `"output_tokens":6`
					fallthrough
				default:
					body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
				}
				body[bound] = 6
				if stream && (path == "/v1/chat/completions" || path == "/v1/completions") {
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				// A forged prefill endpoint: the EPP must replace it.
				resp, data := post(t, f.gateway[mode], path, body, map[string]string{epp.PrefillHeader: "127.0.0.1:1"})
				what := fmt.Sprintf("%s %s stream=%v", mode, path, stream)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d: %s", what, resp.StatusCode, data)
				}
				if stream && !bytes.Contains(data, []byte(end)) {
					t.Errorf("%s: stream without %q: %s", what, end, data)
				}
				if !stream && !bytes.Contains(data, []byte(used)) {
					t.Errorf("%s: answer without its 6 tokens (%s): %s", what, used, data)
				}
				pe, de := prefillAt[resp.Header.Get(sidecar.PrefillEndpointHeader)], decodeAt[resp.Header.Get(envoysim.UpstreamHeader)]
				if pe == nil || de == nil {
					t.Fatalf("%s: prefill endpoint %q, upstream %q: want a prefill engine and a decode sidecar", what,
						resp.Header.Get(sidecar.PrefillEndpointHeader), resp.Header.Get(envoysim.UpstreamHeader))
				}
				// The prefill engine's last request is this one's prefill.
				pc := pe.posts()
				pcall := pc[len(pc)-1]
				var pbody map[string]any
				if err := json.Unmarshal(pcall.body, &pbody); err != nil {
					t.Fatal(err)
				}
				wantP := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
					"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
				if pcall.path != path || !reflect.DeepEqual(pbody["kv_transfer_params"], wantP) || pbody["stream"] != false ||
					pbody[bound] != float64(1) || pbody["stream_options"] != nil || pcall.header.Get(epp.PrefillHeader) != "" {
					t.Errorf("%s: prefill request %s %s (header %q)", what, pcall.path, pcall.body, pcall.header.Get(epp.PrefillHeader))
				}
				pkv := kvOf(t, pcall.answer)
				if pkv["remote_engine_id"] != pe.id || len(pkv["remote_block_ids"].([]any)) == 0 {
					t.Fatalf("%s: prefill answered kv_transfer_params %v", what, pkv)
				}
				// The decode engine's last request carries exactly that KV.
				dc := de.posts()
				dcall := dc[len(dc)-1]
				var dbody map[string]any
				if err := json.Unmarshal(dcall.body, &dbody); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(dbody["kv_transfer_params"], pkv) || dbody["stream"] != stream || dbody[bound] != float64(6) ||
					dcall.path != path || dcall.header.Get(epp.PrefillHeader) != "" {
					t.Errorf("%s: decode request %s %s (header %q), want the client's with the prefill's kv_transfer_params %v",
						what, dcall.path, dcall.body, dcall.header.Get(epp.PrefillHeader), pkv)
				}
			}
		}
	}
	for _, e := range f.decode {
		if got := e.promptTokens(t); got != 0 {
			t.Errorf("decode engine %s computed %v prompt tokens, want 0 (its KV came by transfer)", e.id, got)
		}
	}
	var computed float64
	for _, e := range f.prefill {
		computed += e.promptTokens(t)
	}
	if computed == 0 {
		t.Error("the prefill engines computed no prompt tokens")
	}
	deadline := time.Now().Add(30 * time.Second)
	for f.active() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("bookings %d after every answer ended, want 0", f.active())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
