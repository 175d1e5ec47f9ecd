package queue

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchQueue returns a queue of two classes (weights 3:1, fcfs and wspt,
// 1s aging) holding waiting items, half of them with a due time far
// ahead, and the fake clock after their arrivals. Priorities 0..7 and
// costs 1..8192 tokens are drawn from a seeded generator, so every run
// sees the same heaps.
func benchQueue(b *testing.B, waiting int) (*Queue, *rand.Rand, time.Time) {
	q, err := New(Config{
		Classes: []ClassConfig{{Name: "interactive", Weight: 3}, {Name: "batch", Weight: 1, Order: WSPT}},
		Aging:   time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	now := t0
	for i := range waiting {
		now = now.Add(time.Millisecond)
		if err := q.Push(benchItem(rng, fmt.Sprint(i), now)); err != nil {
			b.Fatal(err)
		}
	}
	return q, rng, now
}

var benchClasses = [2]string{"interactive", "batch"}

func benchItem(rng *rand.Rand, id string, now time.Time) *Item {
	it := &Item{ID: id, Class: benchClasses[rng.IntN(2)], Priority: rng.IntN(8), Cost: 1 + rng.Int64N(8192), Arrival: now}
	if rng.IntN(2) == 0 {
		it.DueAt = now.Add(time.Hour)
	}
	return it
}

// refresh gives a popped or removed item a new arrival, priority and cost,
// so it can be pushed again without allocating. It keeps the class, so
// both classes stay at their initial size.
func refresh(rng *rand.Rand, it *Item, now time.Time) {
	it.Priority = rng.IntN(8)
	it.Cost = 1 + rng.Int64N(8192)
	it.Arrival = now
	if !it.DueAt.IsZero() {
		it.DueAt = now.Add(time.Hour)
	}
}

// BenchmarkPushPop measures one Push and one Pop (one op = both) at a
// steady number of waiting items across two classes. The popped item is
// pushed back as a new arrival, so the queue neither grows nor allocates.
// Compare runs with
//
//	go test -run '^$' -bench . -benchmem -count 10 ./router/queue/ | tee new.txt
//	benchstat old.txt new.txt
func BenchmarkPushPop(b *testing.B) {
	for _, waiting := range []int{100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			q, rng, now := benchQueue(b, waiting)
			it, _ := q.Pop(now)
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Millisecond)
				refresh(rng, it, now)
				if err := q.Push(it); err != nil {
					b.Fatal(err)
				}
				it, _ = q.Pop(now)
			}
		})
	}
}

// BenchmarkRemove measures one Remove of a random waiting item and the
// Push that puts it back (one op = both), at a steady number waiting.
func BenchmarkRemove(b *testing.B) {
	for _, waiting := range []int{100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			q, rng, now := benchQueue(b, waiting)
			ids := make([]string, waiting)
			for i := range ids {
				ids[i] = fmt.Sprint(i)
			}
			b.ReportAllocs()
			for b.Loop() {
				it, ok := q.Remove(ids[rng.IntN(waiting)])
				if !ok {
					b.Fatal("Remove: id not held")
				}
				now = now.Add(time.Millisecond)
				refresh(rng, it, now)
				if err := q.Push(it); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
