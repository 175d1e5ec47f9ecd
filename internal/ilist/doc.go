// Package ilist is an index-linked doubly linked list for entries that
// live in the caller's slice (or chunks): the caller names an entry by
// its int32 index, and the list keeps the links, so one entry can be on
// several lists (one List each) and no operation allocates once the
// links have grown to the largest index. Its users keep recency (LRU)
// orders this way.
//
// The links live in the List, not in the entries: a list reaching into
// its entries through a generic accessor (a type parameter's method or
// a func value) is not inlined and measured three to four times slower
// per move-to-front than a hand-written list; this one measures the same.
//
// It imports nothing of the module.
package ilist
