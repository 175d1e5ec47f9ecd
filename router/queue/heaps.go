package queue

// class is one policy class: its waiting items and its DRR state.
type class struct {
	name    string
	quantum int64 // Weight × base quantum, tokens credited per round
	deficit int64 // DRR deficit counter, tokens; 0 while empty
	heap    classHeap
}

// classHeap orders a class's waiting items, first to serve at the root
// (container/heap). Each entry records its position for O(log n) removal.
type classHeap struct {
	order Order
	es    []*entry
}

func (h *classHeap) Len() int { return len(h.es) }

// Less reports whether a is served before b: higher aged priority, then the
// class's order, then earlier arrival, then smaller ID, so the order is
// total and deterministic.
func (h *classHeap) Less(i, j int) bool {
	a, b := h.es[i], h.es[j]
	if c := cmp128(a.keyHi, a.keyLo, b.keyHi, b.keyLo); c != 0 {
		return c > 0
	}
	switch h.order {
	case LCFS:
		if a.arrival != b.arrival {
			return a.arrival > b.arrival
		}
	case WSPT:
		if a.cost != b.cost {
			return a.cost < b.cost
		}
	}
	if a.arrival != b.arrival {
		return a.arrival < b.arrival
	}
	return a.id < b.id
}

func (h *classHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].classIdx = i
	h.es[j].classIdx = j
}

func (h *classHeap) Push(x any) {
	e := x.(*entry)
	e.classIdx = len(h.es)
	h.es = append(h.es, e)
}

func (h *classHeap) Pop() any {
	n := len(h.es) - 1
	e := h.es[n]
	h.es[n] = nil
	h.es = h.es[:n]
	e.classIdx = -1
	return e
}

// dueHeap indexes the waiting items that have a due time, earliest first
// (ties by ID), across all classes.
type dueHeap struct {
	es []*entry
}

func (h *dueHeap) Len() int { return len(h.es) }

func (h *dueHeap) Less(i, j int) bool {
	a, b := h.es[i], h.es[j]
	if a.due != b.due {
		return a.due < b.due
	}
	return a.id < b.id
}

func (h *dueHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].dueIdx = i
	h.es[j].dueIdx = j
}

func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.dueIdx = len(h.es)
	h.es = append(h.es, e)
}

func (h *dueHeap) Pop() any {
	n := len(h.es) - 1
	e := h.es[n]
	h.es[n] = nil
	h.es = h.es[:n]
	e.dueIdx = -1
	return e
}
