package ilist

// None is the index Front, Back, Next and Prev return past an end.
const None int32 = -1

// link is one entry's neighbours, as index+1 (0: the list's root).
type link struct{ prev, next int32 }

// List is an ordered set of entry indexes (>= 0), front to back. links[0]
// is the root of a circular list and links[i+1] entry i's links, so
// linking and unlinking take no branch. The zero List is empty; a List
// must not be copied once used. An index may be on a List at most once:
// the caller keeps track of which entries are on it (PushFront and
// PushBack of a member, or Remove of a non-member, corrupt the list).
type List struct {
	links []link
}

// grow makes room for index i.
func (l *List) grow(i int32) {
	n := int(i) + 2
	if n < 2*len(l.links) {
		n = 2 * len(l.links)
	}
	links := make([]link, n)
	copy(links, l.links)
	l.links = links
}

// PushFront puts i, not on the list, at the front.
func (l *List) PushFront(i int32) {
	if int(i)+1 >= len(l.links) {
		l.grow(i)
	}
	k := i + 1
	first := l.links[0].next
	l.links[k] = link{prev: 0, next: first}
	l.links[first].prev = k
	l.links[0].next = k
}

// PushBack puts i, not on the list, at the back.
func (l *List) PushBack(i int32) {
	if int(i)+1 >= len(l.links) {
		l.grow(i)
	}
	k := i + 1
	last := l.links[0].prev
	l.links[k] = link{prev: last, next: 0}
	l.links[last].next = k
	l.links[0].prev = k
}

// Remove takes i, which is on the list, off it.
func (l *List) Remove(i int32) {
	e := l.links[i+1]
	l.links[e.prev].next = e.next
	l.links[e.next].prev = e.prev
}

// MoveToFront moves i, which is on the list, to the front.
func (l *List) MoveToFront(i int32) {
	k := i + 1
	e := l.links[k]
	if e.prev == 0 {
		return
	}
	l.links[e.prev].next = e.next
	l.links[e.next].prev = e.prev
	first := l.links[0].next
	l.links[k] = link{prev: 0, next: first}
	l.links[first].prev = k
	l.links[0].next = k
}

// MoveRunToFront moves the run of entries from first to last (both on
// the list, first at or before last, the run read front to back) to the
// front in its order, in constant time: what MoveToFront of last, then
// of each entry before it back to first, does one entry at a time.
func (l *List) MoveRunToFront(first, last int32) {
	a, b := first+1, last+1
	before := l.links[a].prev
	if before == 0 {
		return // already at the front
	}
	after := l.links[b].next
	l.links[before].next = after
	l.links[after].prev = before
	front := l.links[0].next
	l.links[b].next = front
	l.links[front].prev = b
	l.links[a].prev = 0
	l.links[0].next = a
}

// Front returns the first index, or None when the list is empty.
func (l *List) Front() int32 {
	if len(l.links) == 0 {
		return None
	}
	return l.links[0].next - 1
}

// Back returns the last index, or None when the list is empty.
func (l *List) Back() int32 {
	if len(l.links) == 0 {
		return None
	}
	return l.links[0].prev - 1
}

// Next returns the index after i, which is on the list, or None at the
// back.
func (l *List) Next(i int32) int32 { return l.links[i+1].next - 1 }

// Prev returns the index before i, which is on the list, or None at the
// front.
func (l *List) Prev(i int32) int32 { return l.links[i+1].prev - 1 }

// Empty reports whether the list has no index.
func (l *List) Empty() bool { return len(l.links) == 0 || l.links[0].next == 0 }
