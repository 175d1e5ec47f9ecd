package epp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/workers"
	"github.com/switchyard-router/switchyard/shared"
)

// staticWorkers is a live.Workers of fixed URLs, every worker ready.
type staticWorkers map[string]string

func (w staticWorkers) URL(name string) (string, bool) { u, ok := w[name]; return u, ok }
func (staticWorkers) ReportFailure(string)             {}
func (staticWorkers) ReportSuccess(string)             {}
func (staticWorkers) Status() []workers.Status         { return nil }

// samples is a prometheus.Observer keeping every observation.
type samples struct {
	mu sync.Mutex
	v  []float64
}

func (s *samples) Observe(v float64) { s.mu.Lock(); s.v = append(s.v, v); s.mu.Unlock() }

// timedPicker times its Picker's Pick calls.
type timedPicker struct {
	Picker
	obs *samples
}

func (t timedPicker) Pick(ctx context.Context, r *Request) (Pick, error) {
	start := time.Now()
	p, err := t.Picker.Pick(ctx, r)
	t.obs.Observe(time.Since(start).Seconds())
	return p, err
}

// quantile returns the q-quantile of the sorted xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	return xs[min(len(xs)-1, int(q*float64(len(xs))))]
}

// BenchmarkDecision100Endpoints is #16's decision latency: the EPP over
// RouterPicker with the KV-aware policy (kv-cost scored over the prefix
// index, min-cost picked) and 100 endpoints, 64 ext_proc streams at once
// at any -cpu (SetParallelism(64 / GOMAXPROCS)). Each iteration is a
// whole buffered stream over an in-memory gRPC connection: request
// headers, body (the pick), response headers, the last response chunk
// (completion). Prompts are multi-turn conversations over shared system
// prompts, 0.5 to 5 KB of text.
//
// Reported: decision-p50-ms and decision-p99-ms, Server.Decisions' span
// (the whole request held, to the answer with the destination handed to
// gRPC: parse, key, admission, policy over 100 candidates, booking,
// answer); pick-p50-ms and pick-p99-ms, the Picker alone (the same
// without building and sending the answer); decisions/s, whole streams
// per second of wall time; and ns/op, B/op and allocs/op of whole
// streams (client side included).
func BenchmarkDecision100Endpoints(b *testing.B) {
	const endpoints, streams = 100, 64
	path := filepath.Join(b.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(kvPolicy("")), 0o644); err != nil {
		b.Fatal(err)
	}
	bundle, diags := loader.LoadBundle(context.Background(), path, loader.LoadOptions{})
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	r, err := router.New(router.Options{Bundle: bundle.Bundle})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close(context.Background()) })
	ws := staticWorkers{}
	for i := range endpoints {
		name := fmt.Sprintf("w%d", i)
		ws[name] = fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1)
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, Name: name,
			Models: []string{"m"}, TotalKVBlocks: 100_000}); err != nil {
			b.Fatal(err)
		}
	}
	s, err := live.New(live.Options{Router: r, Queue: bundle.Queue(), Workers: ws})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Dispatcher(ctx) }()
	b.Cleanup(func() { cancel(); <-done; s.Close() })
	obs, picks := &samples{}, &samples{}
	c := startServer(b, &Server{Picker: timedPicker{&RouterPicker{Runtime: s, Fallbacks: 2}, picks}, Decisions: obs})

	// 512 conversations over 16 system prompts; each stream sends the
	// next turn of one conversation.
	rng := rand.New(rand.NewPCG(1, 2))
	system := make([]string, 16)
	for i := range system {
		system[i] = fmt.Sprintf("You are assistant %d. ", i) + string(slices.Repeat([]byte("Follow the rules. "), 20+rng.IntN(100)))
	}
	type conv struct {
		mu   sync.Mutex
		text string
	}
	convs := make([]*conv, 512)
	for i := range convs {
		convs[i] = &conv{text: system[rng.IntN(len(system))]}
	}
	body := func(n uint64) string {
		cv := convs[n%uint64(len(convs))]
		cv.mu.Lock()
		defer cv.mu.Unlock()
		if len(cv.text) > 5000 {
			cv.text = cv.text[:len(cv.text)/3]
		}
		cv.text += fmt.Sprintf(" Turn %d: tell me more about topic %d.", n, n%97)
		return chatOf(cv.text)
	}
	var seq sync.Mutex
	next := uint64(0)
	b.ReportAllocs()
	b.SetParallelism(max(1, streams/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			seq.Lock()
			n := next
			next++
			seq.Unlock()
			st, err := c.Process(context.Background())
			if err != nil {
				b.Error(err)
				return
			}
			for _, m := range []*extprocv3.ProcessingRequest{headersMsg(fmt.Sprint("r", n), false, nil), bodyMsg(body(n), true),
				respHeadersMsg(""), respBodyMsg("data: [DONE]\n\n", true)} {
				if err := st.Send(m); err != nil {
					b.Error(err)
					return
				}
				if _, err := st.Recv(); err != nil {
					b.Error(err)
					return
				}
			}
			_ = st.CloseSend()
			_, _ = st.Recv()
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	for _, o := range []struct {
		s    *samples
		name string
	}{{obs, "decision"}, {picks, "pick"}} {
		o.s.mu.Lock()
		xs := slices.Clone(o.s.v)
		o.s.mu.Unlock()
		if len(xs) == 0 {
			b.Fatalf("no %s observed", o.name)
		}
		slices.Sort(xs)
		b.ReportMetric(quantile(xs, 0.5)*1e3, o.name+"-p50-ms")
		b.ReportMetric(quantile(xs, 0.99)*1e3, o.name+"-p99-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
}
