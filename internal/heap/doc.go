// Package heap is a typed binary min-heap: Heap[T] orders values of T by a
// less function, with no interface boxing (container/heap moves values
// through `any`, which allocates for non-pointer values). An optional
// moved function tells each value its index as it moves, for O(log n)
// Remove of a value the caller holds.
//
// It imports nothing of the module.
package heap
