package ilist

import (
	"container/list"
	"math/rand/v2"
	"slices"
	"testing"
)

// contents walks l front to back, and checks the walk back to front
// gives the same indexes reversed.
func contents(t *testing.T, l *List) []int32 {
	t.Helper()
	var fwd, back []int32
	for i := l.Front(); i != None; i = l.Next(i) {
		fwd = append(fwd, i)
		if len(fwd) > 1<<16 {
			t.Fatal("forward walk does not end")
		}
	}
	for i := l.Back(); i != None; i = l.Prev(i) {
		back = append(back, i)
		if len(back) > 1<<16 {
			t.Fatal("backward walk does not end")
		}
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) {
		t.Fatalf("forward walk %v, backward walk reversed %v", fwd, back)
	}
	if l.Empty() != (len(fwd) == 0) {
		t.Fatalf("Empty() = %v with %d entries", l.Empty(), len(fwd))
	}
	return fwd
}

func refContents(r *list.List) []int32 {
	var out []int32
	for e := r.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(int32))
	}
	return out
}

func TestZeroListIsEmpty(t *testing.T) {
	var l List
	if l.Front() != None || l.Back() != None || !l.Empty() {
		t.Fatalf("zero list: Front %d Back %d Empty %v", l.Front(), l.Back(), l.Empty())
	}
}

func TestOrder(t *testing.T) {
	var l List
	l.PushFront(3)
	l.PushFront(7)
	l.PushBack(0)
	l.PushFront(12) // grows the links past the initial size
	if got, want := contents(t, &l), []int32{12, 7, 3, 0}; !slices.Equal(got, want) {
		t.Fatalf("after pushes %v, want %v", got, want)
	}
	l.MoveToFront(0)
	l.MoveToFront(0) // already at the front
	if got, want := contents(t, &l), []int32{0, 12, 7, 3}; !slices.Equal(got, want) {
		t.Fatalf("after MoveToFront %v, want %v", got, want)
	}
	l.Remove(12)
	l.Remove(3)
	if got, want := contents(t, &l), []int32{0, 7}; !slices.Equal(got, want) {
		t.Fatalf("after Remove %v, want %v", got, want)
	}
	if l.Front() != 0 || l.Back() != 7 {
		t.Fatalf("Front %d Back %d, want 0 and 7", l.Front(), l.Back())
	}
	l.Remove(0)
	l.Remove(7)
	if got := contents(t, &l); len(got) != 0 || l.Front() != None || l.Back() != None {
		t.Fatalf("after removing all: %v, Front %d Back %d", got, l.Front(), l.Back())
	}
	l.PushBack(5) // an index reused after the list emptied
	if got, want := contents(t, &l), []int32{5}; !slices.Equal(got, want) {
		t.Fatalf("after emptying and PushBack %v, want %v", got, want)
	}
}

// TestTwoListsPerEntry keeps every index on an all list and the even ones
// on a second, and checks moving on one leaves the other alone.
func TestTwoListsPerEntry(t *testing.T) {
	var all, even List
	for i := int32(0); i < 6; i++ {
		all.PushBack(i)
		if i%2 == 0 {
			even.PushFront(i)
		}
	}
	all.MoveToFront(4)
	even.Remove(2)
	if got, want := contents(t, &all), []int32{4, 0, 1, 2, 3, 5}; !slices.Equal(got, want) {
		t.Fatalf("all %v, want %v", got, want)
	}
	if got, want := contents(t, &even), []int32{4, 0}; !slices.Equal(got, want) {
		t.Fatalf("even %v, want %v", got, want)
	}
}

// TestAgainstContainerList runs random operations on a List and a
// container/list and compares their orders after each.
func TestAgainstContainerList(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var l List
		ref := list.New()
		elems := map[int32]*list.Element{}
		for range 2000 {
			i := int32(rng.IntN(64))
			e, on := elems[i]
			switch op := rng.IntN(6); {
			case !on && op < 2:
				l.PushFront(i)
				elems[i] = ref.PushFront(i)
			case !on:
				l.PushBack(i)
				elems[i] = ref.PushBack(i)
			case op < 2:
				l.MoveToFront(i)
				ref.MoveToFront(e)
			case op < 4:
				l.Remove(i)
				ref.Remove(e)
				delete(elems, i)
			case op == 5:
				// A run of up to 6 entries from i, to the front in its order.
				run := []*list.Element{e}
				for k := rng.IntN(6); k > 0 && run[len(run)-1].Next() != nil; k-- {
					run = append(run, run[len(run)-1].Next())
				}
				l.MoveRunToFront(i, run[len(run)-1].Value.(int32))
				for k := len(run) - 1; k >= 0; k-- {
					ref.MoveToFront(run[k])
				}
			default:
				// Pop the back, as an LRU evicts.
				b := l.Back()
				if want := ref.Back().Value.(int32); b != want {
					t.Fatalf("seed %d: Back %d, want %d", seed, b, want)
				}
				l.Remove(b)
				ref.Remove(elems[b])
				delete(elems, b)
			}
			if got, want := contents(t, &l), refContents(ref); !slices.Equal(got, want) {
				t.Fatalf("seed %d: list %v, container/list %v", seed, got, want)
			}
		}
	}
}

// FuzzAgainstContainerList is TestAgainstContainerList over fuzzed
// operation bytes: low 6 bits the index, high 2 the operation (for an
// entry on the list: 0-1 MoveToFront, 2 Remove, 3 MoveRunToFront of it
// and up to two after it).
func FuzzAgainstContainerList(f *testing.F) {
	f.Add([]byte{0, 1, 2, 65, 130, 195, 3, 64})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var l List
		ref := list.New()
		elems := map[int32]*list.Element{}
		for _, b := range ops {
			i, op := int32(b&63), b>>6
			e, on := elems[i]
			switch {
			case !on && op%2 == 0:
				l.PushFront(i)
				elems[i] = ref.PushFront(i)
			case !on:
				l.PushBack(i)
				elems[i] = ref.PushBack(i)
			case op < 2:
				l.MoveToFront(i)
				ref.MoveToFront(e)
			case op == 2:
				l.Remove(i)
				ref.Remove(e)
				delete(elems, i)
			default:
				// i and the two entries after it (fewer at the back), to
				// the front as a run.
				run := []*list.Element{e}
				for len(run) < 3 && run[len(run)-1].Next() != nil {
					run = append(run, run[len(run)-1].Next())
				}
				l.MoveRunToFront(i, run[len(run)-1].Value.(int32))
				for k := len(run) - 1; k >= 0; k-- {
					ref.MoveToFront(run[k])
				}
			}
		}
		if got, want := contents(t, &l), refContents(ref); !slices.Equal(got, want) {
			t.Fatalf("list %v, container/list %v", got, want)
		}
	})
}

// BenchmarkMoveToFront moves random entries of 1,024 to the front, as an
// LRU hit does.
func BenchmarkMoveToFront(b *testing.B) {
	var l List
	const n = 1024
	for i := int32(0); i < n; i++ {
		l.PushFront(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]int32, 4096)
	for k := range p {
		p[k] = int32(rng.IntN(n))
	}
	for k := 0; b.Loop(); k++ {
		l.MoveToFront(p[k&4095])
	}
}
