package builtin

import (
	"context"
	"fmt"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// BenchmarkClassify measures one in-process Classify with each built-in
// classifier on the path a request takes; the target is <= 1 us and 0
// allocs per request:
//
//   - header-priority: serve-shaped metadata (11 canonical HTTP headers)
//     holding both keys, found by the canonical-form lookup; "-defaults"
//     is the same without them, the worst case (a case-folding scan of
//     every header for each key);
//   - session-affinity: a hit among 10,000 bound sessions on a 64-worker
//     partition (the worker check is a binary search), cycling through
//     1,024 sessions; "+events" adds the request's sent and completed
//     events, delivered as the router does, which is the classifier's whole
//     per-request cost and keeps its state steady;
//   - prompt-length-class: three buckets, a prompt in the middle one.
//
// Requests are built outside the loop, as the router builds them anyway.
// Compare runs with
//
//	go test -run='^$' -bench=BenchmarkClassify -benchmem -count=10 ./builtin/ > new.txt
//	benchstat old.txt new.txt
func BenchmarkClassify(b *testing.B) {
	ctx := context.Background()
	b.Run(TypeHeaderPriority, func(b *testing.B) {
		h, err := NewHeaderPriority(nil)
		if err != nil {
			b.Fatal(err)
		}
		req := &shared.Request{ID: "r", Metadata: httpHeaders()}
		b.ReportAllocs()
		for b.Loop() {
			cl, err := h.Classify(ctx, req)
			if err != nil || cl.Priority != 5 {
				b.Fatal(cl, err)
			}
		}
	})
	b.Run(TypeHeaderPriority+"-defaults", func(b *testing.B) {
		h, err := NewHeaderPriority(nil)
		if err != nil {
			b.Fatal(err)
		}
		md := httpHeaders()
		delete(md, "X-Priority")
		delete(md, "X-Policy-Class")
		req := &shared.Request{ID: "r", Metadata: md}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := h.Classify(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, events := range []bool{false, true} {
		name := TypeSessionAffinity
		if events {
			name += "+events"
		}
		b.Run(name, func(b *testing.B) {
			p, reqs := affinityBench(b)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req := reqs[i%len(reqs)]
				i++
				cl, _ := p.Classify(ctx, req)
				if !cl.HasTarget {
					b.Fatal("miss")
				}
				if events {
					p.OnEvents(benchEvents(req.ID, cl.Target))
				}
			}
		})
	}
	b.Run(TypePromptLengthClass, func(b *testing.B) {
		c, err := NewPromptLengthClass(shared.Params{ParamBuckets: "short:1024,medium:8192,long"})
		if err != nil {
			b.Fatal(err)
		}
		req := &shared.Request{ID: "r", PromptTokens: 5000}
		b.ReportAllocs()
		for b.Loop() {
			if cl, _ := c.Classify(ctx, req); cl.PolicyClass != "medium" {
				b.Fatal(cl)
			}
		}
	})
}

// BenchmarkClassifyParallel is BenchmarkClassify/session-affinity+events
// from GOMAXPROCS goroutines: the cost of the partition's one lock under
// contention.
func BenchmarkClassifyParallel(b *testing.B) {
	b.Run(TypeSessionAffinity+"+events", func(b *testing.B) {
		p, reqs := affinityBench(b)
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				req := reqs[i%len(reqs)]
				i++
				cl, _ := p.Classify(ctx, req)
				p.OnEvents(benchEvents(req.ID, cl.Target))
			}
		})
	})
}

// affinityBench returns a session-affinity partition of 64 workers with
// 10,000 bound sessions, and 1,024 requests of bound sessions.
func affinityBench(b *testing.B) (*affinityPartition, []*shared.Request) {
	b.Helper()
	s, err := NewSessionAffinity(nil)
	if err != nil {
		b.Fatal(err)
	}
	f := newFleet(idsN(64)...)
	c, err := s.NewClassifier(shared.PartitionContext{Model: "m", Role: shared.RoleAggregated, BlockSize: 16,
		Workers: f.workers})
	if err != nil {
		b.Fatal(err)
	}
	p := c.(*affinityPartition)
	ctx := context.Background()
	for i := range 10_000 {
		id, session := fmt.Sprintf("warm%d", i), fmt.Sprintf("session-%d", i)
		_, _ = p.Classify(ctx, &shared.Request{ID: id, SessionID: session})
		p.OnEvents(benchEvents(id, shared.WorkerID(10*(i%64+1))))
	}
	reqs := make([]*shared.Request, 1024)
	for i := range reqs {
		reqs[i] = &shared.Request{ID: fmt.Sprintf("req-%d", i), SessionID: fmt.Sprintf("session-%d", i*9)}
	}
	return p, reqs
}

// benchEvents returns one request's sent and completed events. The batch is
// a stack array the listener must not retain, as the contract says.
func benchEvents(id string, w shared.WorkerID) []shared.Event {
	return []shared.Event{
		{Kind: shared.EventSent, RequestID: id, Worker: w, HasWorker: true},
		{Kind: shared.EventCompleted, RequestID: id, Worker: w, HasWorker: true, ContextTokens: 2048},
	}
}
