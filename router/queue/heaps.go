package queue

import "github.com/switchyard-router/switchyard/internal/heap"

// class is one policy class: its waiting items and its DRR state.
type class struct {
	name    string
	quantum int64 // Weight × base quantum, tokens credited per round
	deficit int64 // DRR deficit counter, tokens; 0 while empty
	// heap orders the class's waiting items, first to serve at the root;
	// each entry records its position (classIdx) for O(log n) removal.
	heap heap.Heap[*entry]
}

func newClassHeap(order Order) heap.Heap[*entry] {
	return heap.NewIndexed(classLess(order), func(e *entry, i int) { e.classIdx = i })
}

// classLess reports whether a is served before b: higher aged priority,
// then the class's order, then earlier arrival, then smaller ID, so the
// order is total and deterministic.
func classLess(order Order) func(a, b *entry) bool {
	return func(a, b *entry) bool {
		if c := cmp128(a.keyHi, a.keyLo, b.keyHi, b.keyLo); c != 0 {
			return c > 0
		}
		switch order {
		case LCFS:
			if a.arrival != b.arrival {
				return a.arrival > b.arrival
			}
		case WSPT:
			if a.cost != b.cost {
				return a.cost < b.cost
			}
		case Slack:
			if a.hasTTFT != b.hasTTFT {
				return a.hasTTFT
			}
			if a.hasTTFT && a.start != b.start {
				return a.start < b.start
			}
		}
		if a.arrival != b.arrival {
			return a.arrival < b.arrival
		}
		return a.id < b.id
	}
}

// newDueHeap returns the index of the waiting items that have a due time,
// earliest first (ties by ID), across all classes; each entry records its
// position (dueIdx, -1 when none).
func newDueHeap() heap.Heap[*entry] {
	return heap.NewIndexed(func(a, b *entry) bool {
		if a.due != b.due {
			return a.due < b.due
		}
		return a.id < b.id
	}, func(e *entry, i int) { e.dueIdx = i })
}
