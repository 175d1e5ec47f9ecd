package serve

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// cannedEngine is a RoundTripper that answers every request with the
// same non-streamed completion, without a network: the benchmark's seam
// between the handler and the engines.
type cannedEngine struct{ body []byte }

func (c cannedEngine) RoundTrip(req *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, req.Body)
	_ = req.Body.Close()
	return &http.Response{
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(c.body))}},
		ContentLength: int64(len(c.body)),
		Body:          io.NopCloser(bytes.NewReader(c.body)),
		Request:       req,
	}, nil
}

// discardWriter is a ResponseWriter that keeps only the status. Like
// net/http's own writer it takes read and write deadlines (through
// http.ResponseController), so the handler's deadline calls cost what
// they cost on a server, not an "unsupported" error each.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header              { return w.h }
func (w *discardWriter) Write(p []byte) (int, error)      { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)             { w.status = code }
func (w *discardWriter) Flush()                           {}
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }
func (w *discardWriter) EnableFullDuplex() error          { return nil }

// BenchmarkHandler is the router's own work for one non-streamed chat
// request (the 2 KiB request of `make bench-serve`), the network left
// out: read and parse the body, hash the routing key, admit (classify,
// select, book), forward through a canned engine, pass the answer back
// and account for it, with metrics on, round-robin over 3 workers. It is what `router serve` adds to
// a request on top of a bare proxy's two hops. The request the server's
// connection would have parsed is built outside the timed loop (each
// iteration takes a shallow copy with its own header and body reader, as
// net/http hands a handler a fresh request), so allocs/op are the
// handler's own allocations per request, the canned engine's answer
// (4 allocations) included.
func BenchmarkHandler(b *testing.B) {
	answer := []byte(`{"id":"cmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"one two three four"},"finish_reason":"length"}],"usage":{"prompt_tokens":512,"completion_tokens":4,"total_tokens":516}}`)
	sys := strings.Repeat("You are a helpful assistant. ", 20)
	user := strings.Repeat("Summarise the switchyard benchmark notes, please. ", 30)[:2048-len(sys)]
	body := []byte(`{"model":"m","max_tokens":4,"stream":false,"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + user + `"}]}`)
	roles := map[shared.Role]*policy.Policy{}
	for _, role := range config.Roles {
		roles[role] = &policy.Policy{Name: "rr", PickerName: "pick", Picker: builtin.NewRoundRobin()}
	}
	r, err := router.New(router.Options{BlockSize: 16, Roles: roles})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.Close(context.Background()) }()
	ws := newBenchWorkers()
	for i := range 3 {
		name := "w" + strconv.Itoa(i+1)
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 27500, Name: name, Models: []string{"m"}}); err != nil {
			b.Fatal(err)
		}
		ws[name] = "http://" + name
	}
	rt, err := live.New(live.Options{Router: r, Workers: ws, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(rt, Options{Transport: cannedEngine{answer}})
	if err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	tmpl := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	tmpl.Header.Set("Content-Type", "application/json")
	tmpl.ContentLength = int64(len(body))
	rd := bytes.NewReader(body)
	rc := io.NopCloser(rd)
	hdr := http.Header{}
	for b.Loop() {
		req := new(http.Request)
		*req = *tmpl
		clear(hdr)
		hdr["Content-Type"] = tmpl.Header["Content-Type"]
		req.Header = hdr
		rd.Reset(body)
		req.Body = rc
		clear(w.h)
		w.status = 0
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
}

// benchWorkers is a Workers over fixed URLs that are always ready.
type benchWorkers map[string]string

func newBenchWorkers() benchWorkers { return benchWorkers{} }

func (ws benchWorkers) URL(name string) (string, bool) { u, ok := ws[name]; return u, ok }
func (benchWorkers) ReportFailure(string)              {}
func (benchWorkers) ReportSuccess(string)              {}
func (benchWorkers) Status() []workers.Status          { return []workers.Status{{Ready: true}} }
