package sim

import (
	"fmt"
	"time"
)

// KVEventKind says how a worker's prefix cache changed.
type KVEventKind uint8

const (
	// KVBlockStored: a prefix group became cached; its first engine block
	// was published by a request's prefill (vLLM's BlockStored).
	KVBlockStored KVEventKind = iota + 1
	// KVBlockRemoved: the last cached engine block of a prefix group was
	// evicted, so the group no longer gives hits (vLLM's BlockRemoved).
	KVBlockRemoved
	// KVAllCleared: every cached group was dropped by ClearPrefixCache
	// (vLLM's AllBlocksCleared, sent on reset_prefix_cache).
	KVAllCleared
)

// String returns "BlockStored", "BlockRemoved" or "AllBlocksCleared".
func (k KVEventKind) String() string {
	switch k {
	case KVBlockStored:
		return "BlockStored"
	case KVBlockRemoved:
		return "BlockRemoved"
	case KVAllCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("KVEventKind(%d)", uint8(k))
}

// KVEvent is one change of a worker's prefix cache, at the granularity of
// prefix groups: one event block is one Request.PrefixHashes entry,
// PrefixBlockTokens tokens (README.md, "KV events", says what this
// approximates).
type KVEvent struct {
	Kind   KVEventKind
	Worker int           // index of the worker in its Cluster (0 for a lone Worker)
	At     time.Duration // simulated time: a store at the end of the step that computed the block, a removal at the start of the step whose allocation evicted it
	// Hash is the group's chained prefix hash (a Request.PrefixHashes
	// entry), on KVBlockStored and KVBlockRemoved.
	Hash uint64
	// Parent, on KVBlockStored, is the chained hash of the preceding group
	// (PrefixHashes[Group-1]); 0, the chain's origin, for Group 0.
	Parent uint64
	// RequestID and Group, on KVBlockStored, name the request whose prefill
	// cached the group and the group's index in its PrefixHashes: the group
	// holds that request's prompt tokens [Group·Tokens, (Group+1)·Tokens).
	// The request is still running when the hook is called.
	RequestID, Group int
	// Tokens, on KVBlockStored, is the group's size in tokens, the
	// request's PrefixBlockTokens.
	Tokens int
}

// SetKVEventHook makes the worker call hook for every change of its prefix
// cache (nil removes it). The hook is called synchronously, from inside
// Advance, Drain, NextEvent, Submit or ClearPrefixCache, in the order the
// changes happen, so At never decreases; it must not call the worker.
// Without a hook the worker does no work for events.
func (w *Worker) SetKVEventHook(hook func(KVEvent)) { w.kv.hook, w.kv.worker = hook, w.index }

// SetKVEventHook sets hook on every worker (see Worker.SetKVEventHook);
// KVEvent.Worker tells them apart. Within one AdvanceTo or Drain the calls
// come worker by worker, so a caller that needs one time order sorts them
// by At (stably, to keep each worker's order).
func (c *Cluster) SetKVEventHook(hook func(KVEvent)) {
	for _, w := range c.workers {
		w.SetKVEventHook(hook)
	}
}

// ClearPrefixCache drops every cached prefix group, as vLLM's
// reset_prefix_cache does: their blocks become free, uncached, and the
// hook gets one KVAllCleared. Like vLLM it refuses, and reports false,
// while any request is running or a step is in flight (their groups are
// pinned); waiting requests are unaffected and will miss.
func (w *Worker) ClearPrefixCache() bool {
	if w.busy || len(w.running) > 0 {
		return false
	}
	c := w.kv
	for i := c.lru.Front(); i >= 0; i = c.lru.Next(i) {
		if nd := &c.nodes[i]; !nd.private {
			delete(c.index, nd.key)
			nd.private, nd.key = true, 0
			c.lruPrivate += int(nd.blocks)
		}
	}
	clear(c.more) // every cached copy was in the LRU list: nothing runs
	if c.hook != nil {
		c.hook(KVEvent{Kind: KVAllCleared, Worker: w.index, At: w.now})
	}
	return true
}
