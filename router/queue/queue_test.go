package queue

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// t0 is a whole second, so Aging of 1s ticks at t0, t0+1s, ...
var t0 = time.Unix(1_700_000_000, 0)

func at(d time.Duration) time.Time { return t0.Add(d) }

func item(id, class string, prio int, cost int64, arrival time.Duration) *Item {
	return &Item{ID: id, Class: class, Priority: prio, Cost: cost, Arrival: at(arrival)}
}

func mustNew(t testing.TB, cfg Config) *Queue {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func mustPush(t testing.TB, q *Queue, items ...*Item) {
	t.Helper()
	for _, it := range items {
		if err := q.Push(it); err != nil {
			t.Fatal(err)
		}
	}
}

// drain pops everything at now and returns the ids in order.
func drain(q *Queue, now time.Time) []string {
	var ids []string
	for {
		it, ok := q.Pop(now)
		if !ok {
			return ids
		}
		ids = append(ids, it.ID)
	}
}

func oneClass(order Order, aging time.Duration) Config {
	return Config{Classes: []ClassConfig{{Name: "c", Weight: 1, Order: order}}, Aging: aging}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string // substrings; none = valid
	}{
		{name: "one class", cfg: oneClass("", 0)},
		{name: "all orders, default class, aging, bounds", cfg: Config{
			Classes:      []ClassConfig{{Name: "a", Weight: 3, Order: FCFS}, {Name: "b", Weight: 1, Order: LCFS}, {Name: "c", Weight: 2, Order: WSPT}},
			DefaultClass: "b", Aging: time.Second, MaxLen: 10, Quantum: 512,
		}},
		{name: "no classes", cfg: Config{}, wantErr: []string{"no classes"}},
		{name: "zero weight", cfg: Config{Classes: []ClassConfig{{Name: "a"}}}, wantErr: []string{`class "a": weight 0, want >= 1`}},
		{name: "empty name", cfg: Config{Classes: []ClassConfig{{Weight: 1}}}, wantErr: []string{"class 0: empty name"}},
		{name: "duplicate", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "a", Weight: 2}}}, wantErr: []string{`class "a": declared twice`}},
		{name: "unknown order", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1, Order: "edf"}}}, wantErr: []string{`unknown order "edf"`}},
		{name: "unknown default", cfg: Config{Classes: []ClassConfig{{Name: "b", Weight: 1}, {Name: "a", Weight: 1}}, DefaultClass: "x"}, wantErr: []string{`default class "x": not declared (have ["a" "b"])`}},
		{name: "negative aging", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1}}, Aging: -time.Second}, wantErr: []string{"aging -1s"}},
		{name: "negative max length", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1}}, MaxLen: -1}, wantErr: []string{"max length -1"}},
		{name: "negative quantum", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1}}, Quantum: -1}, wantErr: []string{"quantum -1 tokens"}},
		{name: "weight times quantum overflows", cfg: Config{Classes: []ClassConfig{{Name: "a", Weight: 1 << 40}}, Quantum: 1 << 20}, wantErr: []string{"exceeds"}},
		{name: "every error at once", cfg: Config{Classes: []ClassConfig{{Name: "a"}, {Name: "b", Weight: 1, Order: "x"}}, Aging: -1}, wantErr: []string{`class "a": weight 0`, `class "b": unknown order`, "aging -1ns"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := New(tt.cfg)
			if len(tt.wantErr) == 0 {
				if err != nil || q == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("New: no error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestPushErrors(t *testing.T) {
	newQ := func(t *testing.T) *Queue {
		q := mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, MaxLen: 2})
		mustPush(t, q, item("x", "", 0, 1, 0))
		return q
	}
	tests := []struct {
		name string
		prep func(q *Queue)
		it   *Item
		want error
	}{
		{name: "nil", it: nil, want: ErrInvalidItem},
		{name: "empty id", it: item("", "a", 0, 1, 0), want: ErrInvalidItem},
		{name: "zero cost", it: item("y", "a", 0, 0, 0), want: ErrInvalidItem},
		{name: "zero arrival", it: &Item{ID: "y", Cost: 1}, want: ErrInvalidItem},
		{name: "unknown class", it: item("y", "z", 0, 1, 0), want: ErrUnknownClass},
		{name: "duplicate in another class", it: item("x", "b", 0, 1, 0), want: ErrDuplicate},
		{name: "full", prep: func(q *Queue) { mustPush(t, q, item("y", "b", 0, 1, 0)) }, it: item("z", "a", 0, 1, 0), want: ErrFull},
		{name: "expired not yet collected still counts", prep: func(q *Queue) {
			it := item("y", "b", 0, 1, 0)
			it.DueAt = at(time.Second)
			mustPush(t, q, it)
			q.Pop(at(2 * time.Second)) // pops x, sets y aside
		}, it: item("y", "a", 0, 1, 0), want: ErrDuplicate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newQ(t)
			if tt.prep != nil {
				tt.prep(q)
			}
			before := q.Len()
			err := q.Push(tt.it)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Push: %v, want %v", err, tt.want)
			}
			if q.Len() != before {
				t.Errorf("Len %d after a failed push, want %d", q.Len(), before)
			}
		})
	}
}

// TestOrders pushes the same items into one class of each order (no
// aging) and checks the exact pop sequence.
func TestOrders(t *testing.T) {
	items := func() []*Item {
		return []*Item{
			item("a", "", 0, 30, 1*time.Millisecond),
			item("b", "", 0, 10, 2*time.Millisecond),
			item("c", "", 0, 20, 3*time.Millisecond),
			item("d", "", 0, 10, 4*time.Millisecond),
			item("e", "", 0, 20, 3*time.Millisecond), // same arrival as c
			item("f", "", 1, 99, 5*time.Millisecond), // higher priority first in every order
		}
	}
	tests := []struct {
		order Order
		want  []string
	}{
		{"", []string{"f", "a", "b", "c", "e", "d"}}, // fcfs by default
		{FCFS, []string{"f", "a", "b", "c", "e", "d"}},
		{LCFS, []string{"f", "d", "c", "e", "b", "a"}}, // equal arrivals by id
		{WSPT, []string{"f", "b", "d", "c", "e", "a"}}, // equal costs by arrival, then id
	}
	for _, tt := range tests {
		t.Run(string(tt.order), func(t *testing.T) {
			q := mustNew(t, oneClass(tt.order, 0))
			mustPush(t, q, items()...)
			if diff := cmp.Diff(tt.want, drain(q, at(time.Hour))); diff != "" {
				t.Errorf("pop order (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSlackOrder: the slack order serves the earliest latest useful
// start (arrival + TTFT - predicted TTFT) first, then the items without
// a TTFT target first come first served; priority still ranks above it.
func TestSlackOrder(t *testing.T) {
	slo := func(id string, prio int, arrival, ttft, pred time.Duration) *Item {
		it := item(id, "", prio, 10, arrival)
		it.TTFT, it.PredictedTTFT = ttft, pred
		return it
	}
	q := mustNew(t, oneClass(Slack, 0))
	mustPush(t, q,
		slo("none-late", 0, 1*time.Millisecond, 0, 0),                             // no target
		slo("loose", 0, 0, 2*time.Second, 100*time.Millisecond),                   // starts by 1.9s
		slo("long", 0, 500*time.Millisecond, 1*time.Second, 800*time.Millisecond), // by 0.7s
		slo("short", 0, 100*time.Millisecond, 1*time.Second, 50*time.Millisecond), // by 1.05s
		slo("none-early", 0, 0, 0, 0),                                             // no target, arrived first
		slo("spent", 0, 2*time.Second, time.Nanosecond, 300*time.Millisecond),     // by 1.7s: already late
		slo("neg-pred", 0, 0, time.Second, -time.Second),                          // a negative prediction counts as 0: by 1s
		slo("urgent", 1, 3*time.Second, 0, 0),                                     // priority first
	)
	want := []string{"urgent", "long", "neg-pred", "short", "spent", "loose", "none-early", "none-late"}
	if diff := cmp.Diff(want, drain(q, at(time.Hour))); diff != "" {
		t.Errorf("pop order (-want +got):\n%s", diff)
	}
}

// TestPriorityAging checks exact sequences with and without aging. With
// Aging 1s an item's aged priority is priority − ⌊arrival/1s⌋ (t0 is a
// whole second), and the order breaks ties.
func TestPriorityAging(t *testing.T) {
	items := func() []*Item {
		return []*Item{
			item("a", "", 0, 5, 0),                     // aged 0
			item("b", "", 2, 5, 1500*time.Millisecond), // 2 − 1 = 1
			item("c", "", 1, 9, 2200*time.Millisecond), // 1 − 2 = −1
			item("d", "", 3, 1, 4000*time.Millisecond), // 3 − 4 = −1
			item("e", "", 0, 5, 900*time.Millisecond),  // 0 − 0 = 0
			item("f", "", 0, 1, 100*time.Millisecond),  // 0 − 0 = 0
		}
	}
	tests := []struct {
		name  string
		order Order
		aging time.Duration
		want  []string
	}{
		{"strict fcfs", FCFS, 0, []string{"d", "b", "c", "a", "f", "e"}},
		{"strict lcfs", LCFS, 0, []string{"d", "b", "c", "e", "f", "a"}},
		{"strict wspt", WSPT, 0, []string{"d", "b", "c", "f", "a", "e"}},
		{"aging fcfs", FCFS, time.Second, []string{"b", "a", "f", "e", "c", "d"}},
		// Within one tick the class order still applies.
		{"aging lcfs", LCFS, time.Second, []string{"b", "e", "f", "a", "d", "c"}},
		{"aging wspt", WSPT, time.Second, []string{"b", "f", "a", "e", "d", "c"}},
		// A 2s tick puts a, e, f (0 − 0), b (2 − 0) and c, d (1 − 1, 3 − 2) apart.
		{"aging 2s fcfs", FCFS, 2 * time.Second, []string{"b", "d", "a", "f", "e", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The order does not depend on when we pop.
			for _, now := range []time.Duration{5 * time.Second, time.Hour} {
				q := mustNew(t, oneClass(tt.order, tt.aging))
				mustPush(t, q, items()...)
				if diff := cmp.Diff(tt.want, drain(q, at(now))); diff != "" {
					t.Errorf("pop order at +%v (-want +got):\n%s", now, diff)
				}
			}
		})
	}
}

func TestKeyExtremes(t *testing.T) {
	q := mustNew(t, oneClass(FCFS, time.Nanosecond))
	mustPush(t, q,
		&Item{ID: "min", Priority: math.MinInt, Cost: 1, Arrival: time.Unix(0, math.MaxInt64)},
		&Item{ID: "max", Priority: math.MaxInt, Cost: 1, Arrival: time.Unix(0, math.MinInt64)},
		&Item{ID: "zero", Priority: 0, Cost: 1, Arrival: time.Unix(0, 1)},
	)
	if diff := cmp.Diff([]string{"max", "zero", "min"}, drain(q, t0)); diff != "" {
		t.Errorf("pop order (-want +got):\n%s", diff)
	}
}

// TestBoundedWait: a priority-0 item under a never-ending stream of
// priority-10 arrivals, one arrival per pop every step, on a fake clock.
// With Aging A the newcomer arriving at time t has aged priority
// 10 − ⌊t/A⌋ and the old item 0 − ⌊a0/A⌋, so the old item wins from the
// first pop at which ⌊t/A⌋ >= ⌊a0/A⌋ + 10 (fcfs: ties go to the earlier
// arrival) or + 11 (lcfs, wspt with a cheaper newcomer: ties go to the
// newcomer). Its wait is that instant minus a0: at most 10·A + step, or
// 11·A + step when ties go against it.
func TestBoundedWait(t *testing.T) {
	const aging = time.Second
	tests := []struct {
		name     string
		order    Order
		arrival  time.Duration // of the old item, after t0
		step     time.Duration
		wantWait time.Duration
	}{
		{"fcfs on a tick", FCFS, 0, 100 * time.Millisecond, 10 * time.Second},
		{"fcfs mid tick", FCFS, 400 * time.Millisecond, 100 * time.Millisecond, 9600 * time.Millisecond},
		{"fcfs coarse steps", FCFS, 0, 3 * time.Second, 12 * time.Second},
		{"lcfs on a tick", LCFS, 0, 100 * time.Millisecond, 11 * time.Second},
		{"wspt mid tick", WSPT, 999 * time.Millisecond, 7 * time.Millisecond, 10*time.Second + 3*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := mustNew(t, oneClass(tt.order, aging))
			old := item("old", "", 0, 100, tt.arrival)
			mustPush(t, q, old)
			now := at(tt.arrival)
			for i := 0; ; i++ {
				now = now.Add(tt.step)
				mustPush(t, q, &Item{ID: "new" + itoa(i), Priority: 10, Cost: 1, Arrival: now})
				it, _ := q.Pop(now)
				if it == old {
					break
				}
				if i > 1_000_000 {
					t.Fatal("old item never popped")
				}
			}
			wait := now.Sub(old.Arrival)
			if wait != tt.wantWait {
				t.Errorf("old item popped after %v, want %v", wait, tt.wantWait)
			}
			bound := 10*aging + tt.step
			if tt.order != FCFS {
				bound += aging
			}
			if wait > bound {
				t.Errorf("wait %v exceeds the bound %v", wait, bound)
			}
		})
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for ; i > 0; i /= 10 {
		n--
		b[n] = byte('0' + i%10)
	}
	return string(b[n:])
}

// TestDRRSequence checks DRR's exact interleaving: weights 3:1, equal
// costs of 100 tokens, base quantum 1 token.
func TestDRRSequence(t *testing.T) {
	q := mustNew(t, Config{Classes: []ClassConfig{{Name: "A", Weight: 3}, {Name: "B", Weight: 1}}})
	for i := range 8 {
		mustPush(t, q, item("a"+itoa(i), "A", 0, 100, 0), item("b"+itoa(i), "B", 0, 100, 0))
	}
	var got []string
	for range 8 {
		it, _ := q.Pop(t0)
		got = append(got, it.Class)
	}
	want := []string{"A", "A", "A", "B", "A", "A", "A", "B"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("classes served (-want +got):\n%s", diff)
	}
}

// backlogged runs pops pops on a queue whose classes are each kept
// backlogged (a popped item is replaced in its class by one of cost(class))
// and returns the count and total cost dispatched per class.
func backlogged(t *testing.T, cfg Config, pops int, cost func(class string) int64) (count, tokens map[string]int64) {
	t.Helper()
	q := mustNew(t, cfg)
	n := 0
	push := func(class string) {
		n++
		mustPush(t, q, item(itoa(n), class, 0, cost(class), time.Duration(n)))
	}
	for _, c := range cfg.Classes {
		for range 3 {
			push(c.Name)
		}
	}
	count, tokens = map[string]int64{}, map[string]int64{}
	for range pops {
		it, ok := q.Pop(t0)
		if !ok {
			t.Fatal("queue ran dry")
		}
		count[it.Class]++
		tokens[it.Class] += it.Cost
		push(it.Class)
	}
	return count, tokens
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestDRRShares(t *testing.T) {
	t.Run("equal costs 3:1", func(t *testing.T) {
		// A quantum far above the costs makes service bursty (a round is
		// Weight × Quantum / cost items per class), so the shares converge
		// only over whole rounds; these all do within 4,000 pops.
		for _, quantum := range []int64{0, 7, 128, 512} {
			cfg := Config{Classes: []ClassConfig{{Name: "hi", Weight: 3}, {Name: "lo", Weight: 1}}, Quantum: quantum}
			count, _ := backlogged(t, cfg, 4000, func(string) int64 { return 128 })
			if !within(float64(count["hi"]), 3000, 0.01) || !within(float64(count["lo"]), 1000, 0.01) {
				t.Errorf("quantum %d: served %v, want 3000/1000 within 1%%", quantum, count)
			}
		}
	})
	t.Run("unequal costs 3:1", func(t *testing.T) {
		// Deterministic costs from a linear congruential sequence, different
		// ranges per class: the cost shares follow the weights, not the counts.
		x := uint64(1)
		next := func(lo, hi int64) int64 {
			x = x*6364136223846793005 + 1442695040888963407
			return lo + int64(x>>33)%(hi-lo+1)
		}
		cfg := Config{Classes: []ClassConfig{{Name: "hi", Weight: 3}, {Name: "lo", Weight: 1}}, Quantum: 16}
		_, tokens := backlogged(t, cfg, 20_000, func(c string) int64 {
			if c == "hi" {
				return next(1, 4000)
			}
			return next(1, 300)
		})
		total := float64(tokens["hi"] + tokens["lo"])
		if !within(float64(tokens["hi"]), 0.75*total, 0.05) || !within(float64(tokens["lo"]), 0.25*total, 0.05) {
			t.Errorf("tokens %v, want shares 3:1 within 5%%", tokens)
		}
	})
	t.Run("three classes 1:2:5, costs 10 and 1000", func(t *testing.T) {
		cfg := Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 5}}}
		_, tokens := backlogged(t, cfg, 50_000, func(c string) int64 {
			if c == "b" {
				return 1000
			}
			return 10
		})
		total := float64(tokens["a"] + tokens["b"] + tokens["c"])
		for c, w := range map[string]float64{"a": 1, "b": 2, "c": 5} {
			if !within(float64(tokens[c]), w/8*total, 0.05) {
				t.Errorf("class %s: %d of %v tokens, want %.0f%% within 5%%", c, tokens[c], total, 100*w/8)
			}
		}
	})
}

// TestDRRServesEveryClassEachRound: with a quantum of at least the largest
// cost, DRR serves every backlogged class in every round, so between two
// services of one class the others are served at most their quantum plus
// one item (Shreedhar and Varghese, Lemma 2).
func TestDRRServesEveryClassEachRound(t *testing.T) {
	const maxCost = 100
	weights := map[string]int64{"a": 1, "b": 2, "c": 5}
	q := mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 5}}, Quantum: maxCost})
	x := uint64(7)
	n := 0
	push := func(class string) {
		x = x*6364136223846793005 + 1442695040888963407
		n++
		mustPush(t, q, item(itoa(n), class, 0, 1+int64(x>>33)%maxCost, 0))
	}
	for c := range weights {
		push(c)
		push(c)
	}
	since := map[string]map[string]int64{} // class -> tokens served to each other class since its last service
	for c := range weights {
		since[c] = map[string]int64{}
	}
	for range 20_000 {
		it, _ := q.Pop(t0)
		for c, others := range since {
			if c == it.Class {
				for o, tok := range others {
					if limit := weights[o]*maxCost + maxCost; tok > limit {
						t.Fatalf("class %s waited while %s got %d tokens, more than %d", c, o, tok, limit)
					}
				}
				since[c] = map[string]int64{}
			} else {
				others[it.Class] += it.Cost
			}
		}
		push(it.Class)
	}
}

// TestDeficitReset: a class that empties, by Pop, Remove or Expire, leaves
// the round robin with its deficit cleared.
func TestDeficitReset(t *testing.T) {
	cfg := Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, Quantum: 1000}
	empty := map[string]func(q *Queue){
		"pop":    func(q *Queue) { q.Pop(t0) },
		"remove": func(q *Queue) { q.Remove("a1") },
		"expire": func(q *Queue) { q.Expire(at(2*time.Second), nil) },
	}
	for name, f := range empty {
		t.Run(name, func(t *testing.T) {
			q := mustNew(t, cfg)
			a0 := item("a0", "a", 0, 10, 0)
			a1 := item("a1", "a", 0, 10, time.Millisecond)
			a1.DueAt = at(time.Second)
			mustPush(t, q, a0, a1, item("b0", "b", 0, 10, 0))
			if it, _ := q.Pop(t0); it != a0 {
				t.Fatalf("first pop %v, want a0", it)
			}
			if d := q.classes[0].deficit; d != 990 {
				t.Fatalf("deficit of a after one pop: %d, want 990", d)
			}
			f(q)
			if q.ClassLen("a") != 0 {
				t.Fatalf("ClassLen(a) = %d, want 0", q.ClassLen("a"))
			}
			if d := q.classes[0].deficit; d != 0 {
				t.Errorf("deficit of emptied class: %d, want 0", d)
			}
			if diff := cmp.Diff([]int32{1}, q.drr.ring); diff != "" {
				t.Errorf("ring (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExpire(t *testing.T) {
	q := mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}})
	due := func(it *Item, d time.Duration) *Item { it.DueAt = at(d); return it }
	mustPush(t, q,
		due(item("x", "a", 9, 1, 0), 3*time.Second),
		due(item("y", "b", 0, 1, 0), time.Second),
		due(item("z", "a", 0, 1, 0), time.Second), // same due as y: by id
		item("w", "b", 0, 1, 0),                   // never expires
		due(item("v", "a", 0, 1, 0), 10*time.Second),
	)
	var ids []string
	for _, it := range q.Expire(at(500*time.Millisecond), nil) {
		ids = append(ids, it.ID)
	}
	if len(ids) != 0 {
		t.Fatalf("Expire before any due time: %v", ids)
	}

	// At +3s, x (priority 9) is due: Pop skips it and sets it, y and z aside.
	it, ok := q.Pop(at(3 * time.Second))
	if !ok || it.ID != "v" {
		t.Fatalf("Pop at +3s: %v, want v", it)
	}
	if q.Len() != 1 || q.ClassLen("a") != 0 || q.ClassLen("b") != 1 {
		t.Errorf("Len %d, a %d, b %d; want 1, 0, 1", q.Len(), q.ClassLen("a"), q.ClassLen("b"))
	}
	// Set-aside items can still be cancelled, and keep their ids.
	if it, ok := q.Remove("z"); !ok || it.ID != "z" {
		t.Errorf("Remove(z) of a set-aside item: %v %v", it, ok)
	}
	if err := q.Push(item("x", "b", 0, 1, 0)); !errors.Is(err, ErrDuplicate) {
		t.Errorf("Push of a set-aside id: %v, want ErrDuplicate", err)
	}
	for _, it := range q.Expire(at(3*time.Second), nil) {
		ids = append(ids, it.ID)
	}
	if diff := cmp.Diff([]string{"y", "x"}, ids); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	if got := q.Expire(at(time.Hour), nil); len(got) != 0 {
		t.Errorf("second Expire returned %d items", len(got))
	}
	if err := q.Push(item("x", "b", 0, 1, 0)); err != nil {
		t.Errorf("Push after Expire returned the id: %v", err)
	}
	if diff := cmp.Diff([]string{"w", "x"}, drain(q, at(time.Hour))); diff != "" {
		t.Errorf("remaining (-want +got):\n%s", diff)
	}
}

func TestPeek(t *testing.T) {
	q := mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}})
	if _, ok := q.Peek(t0); ok {
		t.Fatal("Peek on an empty queue")
	}
	for i := range 20 {
		mustPush(t, q, item("a"+itoa(i), "a", i%3, 50, time.Duration(i)), item("b"+itoa(i), "b", 0, 70, time.Duration(i)))
	}
	for q.Len() > 0 {
		p1, _ := q.Peek(t0)
		p2, _ := q.Peek(t0)
		it, _ := q.Pop(t0)
		if p1 != it || p2 != it {
			t.Fatalf("Peek %s, %s then Pop %s", p1.ID, p2.ID, it.ID)
		}
	}
}

func TestRemove(t *testing.T) {
	q := mustNew(t, oneClass(FCFS, 0))
	for i := range 6 {
		it := item(itoa(i), "", 0, 1, time.Duration(i))
		it.DueAt = at(time.Hour)
		mustPush(t, q, it)
	}
	for _, id := range []string{"3", "0", "5"} {
		if it, ok := q.Remove(id); !ok || it.ID != id {
			t.Fatalf("Remove(%s) = %v, %v", id, it, ok)
		}
	}
	if _, ok := q.Remove("3"); ok {
		t.Error("Remove of a removed id succeeded")
	}
	if _, ok := q.Remove("nope"); ok {
		t.Error("Remove of an unknown id succeeded")
	}
	if q.Len() != 3 || q.due.Len() != 3 {
		t.Errorf("Len %d, due index %d; want 3, 3", q.Len(), q.due.Len())
	}
	mustPush(t, q, item("3", "", 0, 1, 3)) // the id is free again
	if diff := cmp.Diff([]string{"1", "2", "3", "4"}, drain(q, t0)); diff != "" {
		t.Errorf("remaining (-want +got):\n%s", diff)
	}
}

func TestDefaultClass(t *testing.T) {
	q := mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, DefaultClass: "b"})
	mustPush(t, q, item("x", "", 0, 1, 0))
	if q.ClassLen("b") != 1 || q.ClassLen("a") != 0 || q.ClassLen("zzz") != 0 {
		t.Errorf("ClassLen a %d b %d zzz %d; want 0 1 0", q.ClassLen("a"), q.ClassLen("b"), q.ClassLen("zzz"))
	}
	q = mustNew(t, Config{Classes: []ClassConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}})
	mustPush(t, q, item("x", "", 0, 1, 0))
	if q.ClassLen("a") != 1 {
		t.Errorf("without DefaultClass the first class gets the item: ClassLen(a) = %d", q.ClassLen("a"))
	}
}
