package prefix

import (
	"sync"

	"github.com/switchyard-router/switchyard/internal/ilist"
)

// lru is one worker's set of block hashes in recency order: an
// index-linked list over the hash array (front = most recent), with a
// map from hash to index (hashPos). No allocation after the arrays fill. mu guards
// every field but owner and capacity; dead marks a list its worker left.
// owner is the candidate's slot in the index (Index.Slot).
type lru struct {
	mu       sync.Mutex
	dead     bool
	owner    int32
	single   []int32 // {owner}: the holder list of blocks only it holds
	capacity int
	pos      hashPos
	hash     []uint64
	order    ilist.List
}

func newLRU(owner int32, capacity int) *lru {
	return &lru{owner: owner, single: []int32{owner}, capacity: capacity, pos: newHashPos()}
}

// touch moves h to the front and reports whether it was present.
func (l *lru) touch(h uint64) bool {
	i, ok := l.pos.get(h)
	if !ok {
		return false
	}
	l.order.MoveToFront(i)
	return true
}

// run reports whether hashes are all on the list, one after another in
// their order (hashes[0] the most recent of them), and where the run
// begins and ends: then recording them moves the run to the front as it
// is (ilist.List.MoveRunToFront), and a run already at the front stays.
// At most one lookup and len(hashes) steps along the list.
func (l *lru) run(hashes []uint64) (first, last int32, ok bool) {
	if len(hashes) == 0 {
		return 0, 0, false
	}
	// At the front (the last prompt recorded here again) without the lookup.
	if first = l.order.Front(); first == ilist.None || l.hash[first] != hashes[0] {
		if first, ok = l.pos.get(hashes[0]); !ok {
			return 0, 0, false
		}
	}
	last = first
	for _, h := range hashes[1:] {
		if last = l.order.Next(last); last == ilist.None || l.hash[last] != h {
			return 0, 0, false
		}
	}
	return first, last, true
}

// insert adds an absent h at the front; when full it evicts the least
// recently used hash first and returns it.
func (l *lru) insert(h uint64) (evicted uint64, ok bool) {
	var i int32
	if l.pos.len() >= l.capacity {
		i = l.order.Back()
		evicted, ok = l.hash[i], true
		l.pos.del(evicted)
		l.order.Remove(i)
	} else {
		i = int32(len(l.hash))
		l.hash = append(l.hash, 0)
	}
	l.hash[i] = h
	l.pos.put(h, i)
	l.order.PushFront(i)
	return evicted, ok
}

// leading returns how many leading hashes l holds. l.mu is held.
func (l *lru) leading(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := l.pos.get(h); !ok {
			break
		}
		n++
	}
	return n
}
