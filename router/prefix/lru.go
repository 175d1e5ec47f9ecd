package prefix

import "sync"

// lru is one worker's set of block hashes in recency order: an intrusive
// doubly linked list over preallocated arrays (head = most recent), with a
// map from hash to node. No allocation after the arrays fill. mu guards
// every field but owner and capacity; dead marks a list its worker left.
// owner is the candidate's slot in the index (Index.Slot).
type lru struct {
	mu         sync.Mutex
	dead       bool
	owner      int32
	single     []int32 // {owner}: the holder list of blocks only it holds
	capacity   int
	pos        map[uint64]int32
	hash       []uint64
	prev, next []int32
	head, tail int32
}

func newLRU(owner int32, capacity int) *lru {
	return &lru{owner: owner, single: []int32{owner}, capacity: capacity, pos: make(map[uint64]int32), head: -1, tail: -1}
}

// touch moves h to the front and reports whether it was present.
func (l *lru) touch(h uint64) bool {
	i, ok := l.pos[h]
	if !ok {
		return false
	}
	if l.head != i {
		l.unlink(i)
		l.pushFront(i)
	}
	return true
}

// insert adds an absent h at the front; when full it evicts the least
// recently used hash first and returns it.
func (l *lru) insert(h uint64) (evicted uint64, ok bool) {
	var i int32
	if len(l.pos) >= l.capacity {
		i = l.tail
		evicted, ok = l.hash[i], true
		delete(l.pos, evicted)
		l.unlink(i)
	} else {
		i = int32(len(l.hash))
		l.hash = append(l.hash, 0)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	}
	l.hash[i] = h
	l.pos[h] = i
	l.pushFront(i)
	return evicted, ok
}

func (l *lru) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.prev[i], l.next[i] = -1, -1
}

func (l *lru) pushFront(i int32) {
	l.prev[i] = -1
	l.next[i] = l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// leading returns how many leading hashes l holds. l.mu is held.
func (l *lru) leading(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if _, ok := l.pos[h]; !ok {
			break
		}
		n++
	}
	return n
}
