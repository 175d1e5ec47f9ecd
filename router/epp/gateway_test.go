package epp_test

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
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/internal/envoysim"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// gateway is a fleet of mock engines (model "m") behind the EPP (a
// RouterPicker over a live runtime, on a real gRPC listener) and the
// Envoy stand-in in front of it, in both body modes.
type gateway struct {
	r       *router.Router
	urls    map[envoysim.Mode]string
	mu      sync.Mutex
	posts   map[string][]string // endpoint -> the paths it was sent, in order
	engines []string            // the engines' endpoints
}

func newGateway(t *testing.T, n int) *gateway {
	t.Helper()
	g := &gateway{posts: map[string][]string{}}
	models := make([]string, n)
	for i := range models {
		models[i] = "m"
	}
	f := epp.NewFleet(t, epp.FleetOptions{
		Models: models,
		Wrap: func(ep, _ string, m http.Handler) http.Handler {
			g.engines = append(g.engines, ep)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" && r.URL.Path != "/v1/models" && r.URL.Path != "/health" {
					g.mu.Lock()
					g.posts[ep] = append(g.posts[ep], r.Method+" "+r.URL.RequestURI())
					g.mu.Unlock()
				}
				m.ServeHTTP(w, r)
			})
		},
		SetPicker: func(p *epp.RouterPicker) { p.Fallbacks = 1 },
	})
	g.r = f.Router
	g.urls = serveGateway(t, f)
	return g
}

// serveGateway serves f's EPP (its Picker) on a real gRPC listener and
// the Envoy stand-in in front of it in both body modes; it returns the
// stand-in's URL for each mode.
func serveGateway(t *testing.T, f *epp.Fleet) map[envoysim.Mode]string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(epp.GRPCServerOptions(live.DefaultMaxBodyBytes)...)
	epp.Register(gs, &epp.Server{Picker: f.Picker})
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(ln) }()
	t.Cleanup(func() { gs.Stop(); <-served })
	urls := map[envoysim.Mode]string{}
	for _, mode := range []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex} {
		p, err := envoysim.New(envoysim.Config{EPP: ln.Addr().String(), Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(p)
		t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); _ = p.Close() })
		urls[mode] = hs.URL
	}
	return urls
}

// sent returns how many requests the engine at ep was sent.
func (g *gateway) sent(ep string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.posts[ep])
}

// total returns how many requests the engines were sent, all together.
func (g *gateway) total() int {
	n := 0
	for _, ep := range g.engines {
		n += g.sent(ep)
	}
	return n
}

// settle waits until no worker has a booking.
func (g *gateway) settle(t *testing.T) {
	t.Helper()
	settle(t, g.r, "m")
}

// settle waits until no worker of the models has a booking; it fails t
// when some still have after a minute.
func settle(t *testing.T, r *router.Router, models ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		for _, model := range models {
			for _, w := range r.Workers(model, shared.RoleAggregated) {
				n += w.ActiveRequests()
			}
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bookings a minute later, want none", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// do sends one request through the gateway and returns its status, the
// endpoint that served it ("" when the EPP answered it) and its body.
func do(t *testing.T, method, url, body string) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return send(t, context.Background(), method, url, "application/json", rd)
}

// send sends one request with Content-Type ct through the gateway and
// returns its status, the endpoint that served it ("" when the EPP
// answered it) and its body.
func send(t *testing.T, ctx context.Context, method, url, ct string, body io.Reader) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(envoysim.UpstreamHeader), b
}

// responseID reads a Responses answer's id: a whole answer's "id", or a
// stream's response.created event's response.id.
func responseID(t *testing.T, body []byte, stream bool) string {
	t.Helper()
	if !stream {
		var v struct{ ID string }
		if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
			t.Fatalf("no id in %s (%v)", body, err)
		}
		return v.ID
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string
			Response struct{ ID string }
		}
		if json.Unmarshal([]byte(data), &ev) == nil && ev.Type == "response.created" && ev.Response.ID != "" {
			return ev.Response.ID
		}
	}
	t.Fatalf("no response.created event in %s", body)
	return ""
}

// TestGatewayRoutesTheEngineAPI: the whole engine API through the Envoy
// stand-in and the EPP, on real gRPC, in both body modes, over three mock
// engines that store their responses (as vLLM with its store on):
//
//   - a Responses conversation of four turns, streamed and not: each
//     follow-up (previous_response_id) reaches the engine that answered
//     the turn before (the engine answers 404 for an id it does not
//     hold, so a 200 is the proof), the id learnt from the answer as the
//     EPP saw it;
//   - GET /v1/responses/{id}, with its query, reaches that engine too;
//   - an unknown id is answered by the EPP with vLLM's 404, no engine
//     asked;
//   - embeddings, rerank and tokenize reach an engine, which answers;
//   - a POST under /v1/ the router does not know, naming the model, is
//     passed through to an engine (which answers it 404 as FastAPI does);
//     one naming no model is the EPP's 404;
//
// and the bookings return to 0.
func TestGatewayRoutesTheEngineAPI(t *testing.T) {
	g := newGateway(t, 3)
	for _, mode := range []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex} {
		base := g.urls[mode]
		status, at, body := do(t, "POST", base+"/v1/responses", `{"model":"m","input":"what is a router?","max_output_tokens":4}`)
		if status != 200 || at == "" {
			t.Fatalf("%v: first turn %d from %q: %s", mode, status, at, body)
		}
		id := responseID(t, body, false)
		for turn, stream := range []bool{true, false, true} {
			b := fmt.Sprintf(`{"model":"m","input":"and then? (%d)","max_output_tokens":4,"stream":%v,"previous_response_id":%q}`, turn, stream, id)
			status, got, body := do(t, "POST", base+"/v1/responses", b)
			if status != 200 || got != at {
				t.Fatalf("%v: follow-up %d (stream %v) of %s: %d from %q, want 200 from %s, which holds it: %s", mode, turn, stream, id, status, got, at, body)
			}
			id = responseID(t, body, stream)
		}
		status, got, body := do(t, "GET", base+"/v1/responses/"+id+"?include_obfuscation=false", "")
		if status != 200 || got != at || !bytes.Contains(body, []byte(id)) {
			t.Fatalf("%v: GET %s: %d from %q, want 200 from %s: %s", mode, id, status, got, at, body)
		}
		before := g.total()
		for _, tc := range []struct{ method, path, body string }{
			{"POST", "/v1/responses", `{"model":"m","input":"go on","previous_response_id":"resp_nobody"}`},
			{"GET", "/v1/responses/resp_nobody", ""},
			{"POST", "/v1/responses/resp_nobody/cancel", ""},
		} {
			status, got, body := do(t, tc.method, base+tc.path, tc.body)
			want := `{"error":{"message":"Response with id 'resp_nobody' not found.","type":"invalid_request_error","param":"response_id","code":404}}` + "\n"
			if status != 404 || got != "" || string(body) != want {
				t.Errorf("%v: %s %s: %d from %q: %s; want the EPP's 404 %s", mode, tc.method, tc.path, status, got, body, want)
			}
		}
		if n := g.total(); n != before {
			t.Errorf("%v: the engines were sent %d requests for unknown ids, want none", mode, n-before)
		}
		for _, tc := range []struct {
			path, body string
			status     int
			want       string
		}{
			{"/v1/embeddings", `{"model":"m","input":["a","b"]}`, 200, `"embedding"`},
			{"/v1/rerank", `{"model":"m","query":"q","documents":["a","b"]}`, 200, `"relevance_score"`},
			// A mock engine without a tokenizer file answers tokenize
			// 404 in its own words: the request reached it.
			{"/tokenize", `{"model":"m","prompt":"hello there"}`, 404, `this mock engine has no tokenizer`},
		} {
			status, got, body := do(t, "POST", base+tc.path, tc.body)
			if status != tc.status || got == "" || !bytes.Contains(body, []byte(tc.want)) {
				t.Errorf("%v: %s: %d from %q: %s; want %d from an engine with %s", mode, tc.path, status, got, body, tc.status, tc.want)
			}
		}
		n := g.total()
		status, got, body = do(t, "POST", base+"/v1/images/generations", `{"model":"m","prompt":"say"}`)
		if status != 404 || got == "" || string(body) != `{"detail":"Not Found"}` || g.total() != n+1 {
			t.Errorf("%v: pass-through: %d from %q: %s; want the engine's own 404", mode, status, got, body)
		}
		status, got, body = do(t, "POST", base+"/v1/images/generations", `{"prompt":"say"}`)
		if status != 404 || got != "" || !bytes.Contains(body, []byte(`"not_found"`)) {
			t.Errorf("%v: pass-through without a model: %d from %q: %s; want the EPP's 404 not_found", mode, status, got, body)
		}
		g.settle(t)
	}
}
