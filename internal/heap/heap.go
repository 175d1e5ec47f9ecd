package heap

// Heap is a binary min-heap of T: At(0) is a least value by less. Equal
// values pop in no specified order; a less that is a total order makes
// the pops deterministic. The zero Heap is not usable: make one with New
// or NewIndexed.
type Heap[T any] struct {
	items []T
	less  func(a, b T) bool
	moved func(x T, i int)
}

// New returns an empty heap ordered by less, which reports whether a
// comes before b.
func New[T any](less func(a, b T) bool) Heap[T] {
	return Heap[T]{less: less}
}

// NewIndexed returns an empty heap ordered by less that calls moved(x, i)
// whenever x lands at index i, and moved(x, -1) when Pop or Remove takes
// x out, so that the caller can keep each value's index for Remove.
func NewIndexed[T any](less func(a, b T) bool, moved func(x T, i int)) Heap[T] {
	return Heap[T]{less: less, moved: moved}
}

// Len returns the number of values.
func (h *Heap[T]) Len() int { return len(h.items) }

// At returns the value at index i (0 <= i < Len()); At(0) is a least.
func (h *Heap[T]) At(i int) T { return h.items[i] }

// Push adds x. O(log n).
func (h *Heap[T]) Push(x T) {
	h.items = append(h.items, x)
	h.up(len(h.items)-1, x)
}

// Pop removes and returns a least value; the heap must not be empty.
// O(log n).
func (h *Heap[T]) Pop() T {
	return h.Remove(0)
}

// Remove removes and returns the value at index i (0 <= i < Len()).
// O(log n).
func (h *Heap[T]) Remove(i int) T {
	n := len(h.items) - 1
	x := h.items[i]
	last := h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	if i < n {
		h.items[i] = last
		if !h.down(i, last) {
			h.up(i, last)
		}
	}
	if h.moved != nil {
		h.moved(x, -1)
	}
	return x
}

// up moves x, at index j, towards the root to its place.
func (h *Heap[T]) up(j int, x T) {
	for j > 0 {
		i := (j - 1) / 2
		p := h.items[i]
		if !h.less(x, p) {
			break
		}
		h.items[j] = p
		if h.moved != nil {
			h.moved(p, j)
		}
		j = i
	}
	h.items[j] = x
	if h.moved != nil {
		h.moved(x, j)
	}
}

// down moves x, at index i0, towards the leaves to its place and reports
// whether it moved.
func (h *Heap[T]) down(i0 int, x T) bool {
	n := len(h.items)
	i := i0
	for {
		j := 2*i + 1
		if j >= n || j < 0 {
			break
		}
		c := h.items[j]
		if r := j + 1; r < n {
			if cr := h.items[r]; h.less(cr, c) {
				j, c = r, cr
			}
		}
		if !h.less(c, x) {
			break
		}
		h.items[i] = c
		if h.moved != nil {
			h.moved(c, i)
		}
		i = j
	}
	h.items[i] = x
	if h.moved != nil {
		h.moved(x, i)
	}
	return i > i0
}
