package heap

import (
	"cmp"
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPopsInOrder(t *testing.T) {
	h := New(func(a, b int) bool { return a < b })
	for _, x := range []int{5, 1, 9, 3, 3, 7, 0} {
		h.Push(x)
	}
	if h.Len() != 7 || h.At(0) != 0 {
		t.Fatalf("Len %d At(0) %d, want 7 and 0", h.Len(), h.At(0))
	}
	var got []int
	for h.Len() > 0 {
		got = append(got, h.Pop())
	}
	if want := []int{0, 1, 3, 3, 5, 7, 9}; !slices.Equal(got, want) {
		t.Fatalf("pops %v, want %v", got, want)
	}
}

// item is a value that knows its index, as NewIndexed's users keep it.
type item struct {
	v   int
	idx int
}

func newItems() Heap[*item] {
	return NewIndexed(func(a, b *item) bool { return a.v < b.v }, func(x *item, i int) { x.idx = i })
}

// checkIndexed checks each item's idx is its index and the heap property.
func checkIndexed(t *testing.T, h *Heap[*item]) {
	t.Helper()
	for i := range h.Len() {
		if x := h.At(i); x.idx != i {
			t.Fatalf("item %d at index %d records %d", x.v, i, x.idx)
		}
		if i > 0 && h.At(i).v < h.At((i-1)/2).v {
			t.Fatalf("index %d (%d) less than its parent (%d)", i, h.At(i).v, h.At((i-1)/2).v)
		}
	}
}

func TestIndexedRemove(t *testing.T) {
	h := newItems()
	its := make([]*item, 10)
	for k := range its {
		its[k] = &item{v: (k * 7) % 10}
		h.Push(its[k])
	}
	checkIndexed(t, &h)
	x := its[4] // v 8
	if got := h.Remove(x.idx); got != x || x.idx != -1 {
		t.Fatalf("Remove returned v %d idx %d, want v 8 idx -1", got.v, x.idx)
	}
	checkIndexed(t, &h)
	// Remove and push again, as a caller changing a value's key does.
	h.Remove(its[2].idx) // v 4
	its[2].v = -1
	h.Push(its[2])
	checkIndexed(t, &h)
	if h.At(0) != its[2] {
		t.Fatalf("At(0) = %d after re-push, want -1", h.At(0).v)
	}
	var got []int
	for h.Len() > 0 {
		y := h.Pop()
		if y.idx != -1 {
			t.Fatalf("popped %d records index %d, want -1", y.v, y.idx)
		}
		got = append(got, y.v)
	}
	if want := []int{-1, 0, 1, 2, 3, 5, 6, 7, 9}; !slices.Equal(got, want) {
		t.Fatalf("pops %v, want %v", got, want)
	}
}

// TestAgainstSort pushes, pops and removes at random and checks
// every pop against the least of a plain slice kept beside.
func TestAgainstSort(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		h := newItems()
		var live []*item
		for range 3000 {
			switch op := rng.IntN(10); {
			case op < 5 || len(live) == 0:
				x := &item{v: rng.IntN(100)}
				h.Push(x)
				live = append(live, x)
			case op < 7:
				least := slices.MinFunc(live, func(a, b *item) int { return cmp.Compare(a.v, b.v) })
				y := h.Pop()
				if y.v != least.v {
					t.Fatalf("seed %d: popped %d, least is %d", seed, y.v, least.v)
				}
				live = slices.DeleteFunc(live, func(z *item) bool { return z == y })
			default:
				x := live[rng.IntN(len(live))]
				if y := h.Remove(x.idx); y != x {
					t.Fatalf("seed %d: Remove(%d) returned %d, want %d", seed, x.idx, y.v, x.v)
				}
				live = slices.DeleteFunc(live, func(z *item) bool { return z == x })
			}
			if h.Len() != len(live) {
				t.Fatalf("seed %d: Len %d, want %d", seed, h.Len(), len(live))
			}
			checkIndexed(t, &h)
		}
		want := make([]int, len(live))
		for k, x := range live {
			want[k] = x.v
		}
		slices.Sort(want)
		var got []int
		for h.Len() > 0 {
			got = append(got, h.Pop().v)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: drained %v, sorted %v", seed, got, want)
		}
	}
}

// FuzzPopsSorted pushes fuzzed values (negative ones pop instead) and
// checks the pops and the final drain against a sorted copy.
func FuzzPopsSorted(f *testing.F) {
	f.Add([]byte{3, 1, 200, 2, 2, 255, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		h := New(func(a, b int8) bool { return a < b })
		var ref []int8
		for _, b := range ops {
			v := int8(b)
			if v < 0 && len(ref) > 0 {
				slices.Sort(ref)
				if got := h.Pop(); got != ref[0] {
					t.Fatalf("popped %d, want %d", got, ref[0])
				}
				ref = ref[1:]
				continue
			}
			h.Push(v)
			ref = append(ref, v)
		}
		slices.Sort(ref)
		for _, want := range ref {
			if got := h.Pop(); got != want {
				t.Fatalf("drained %d, want %d", got, want)
			}
		}
		if h.Len() != 0 {
			t.Fatalf("Len %d after drain", h.Len())
		}
	})
}

// due is a replay-style event: a time and a tie-break.
type due struct {
	at    int64
	index int
}

func dueLess(a, b due) bool { return a.at < b.at || a.at == b.at && a.index < b.index }

type dueQueue []due

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return dueLess(q[i], q[j]) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(due)) }
func (q *dueQueue) Pop() any {
	o := *q
	x := o[len(o)-1]
	*q = o[:len(o)-1]
	return x
}

// BenchmarkPopPush pops the least of 512 events and pushes a later one,
// as a simulated-time driver does; /container is container/heap.
func BenchmarkPopPush(b *testing.B) {
	steps := make([]int64, 4096)
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range steps {
		steps[k] = rng.Int64N(1000)
	}
	b.Run("heap", func(b *testing.B) {
		h := New(dueLess)
		for k := range 512 {
			h.Push(due{steps[k], k})
		}
		for k := 0; b.Loop(); k++ {
			x := h.Pop()
			h.Push(due{x.at + steps[k&4095], k})
		}
	})
	b.Run("container", func(b *testing.B) {
		var q dueQueue
		for k := range 512 {
			heap.Push(&q, due{steps[k], k})
		}
		for k := 0; b.Loop(); k++ {
			x := heap.Pop(&q).(due)
			heap.Push(&q, due{x.at + steps[k&4095], k})
		}
	})
}
