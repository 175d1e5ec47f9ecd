// Package queue is the router's request queue: requests that cannot be
// placed wait here, grouped into policy classes. Classes share dispatches
// by weighted deficit round robin on each request's scheduling cost; within
// a class requests go by (aged priority, the class's order). Requests whose
// due time passes are set aside and handed back by Expire, never dropped.
// Every operation costs O(C + log n) for C classes and n waiting requests.
// README.md states the rules and their sources.
//
// A Queue is not safe for concurrent use: the router guards it with its
// own lock.
package queue

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/switchyard-router/switchyard/internal/heap"
)

// Errors returned by Push, wrapped with the item's id; test with errors.Is.
var (
	// ErrFull: the queue already holds MaxLen items.
	ErrFull = errors.New("queue full")
	// ErrUnknownClass: the item names a class the queue was not configured with.
	ErrUnknownClass = errors.New("unknown policy class")
	// ErrDuplicate: an item with the same ID is still held (waiting, or
	// expired and not yet returned by Expire).
	ErrDuplicate = errors.New("duplicate request id")
	// ErrInvalidItem: a nil item, an empty ID, a Cost below 1 or a zero
	// Arrival.
	ErrInvalidItem = errors.New("invalid item")
)

// Order is how a class orders items of equal aged priority.
type Order string

// The orders a class can use.
const (
	// FCFS serves the earliest arrival first (the default).
	FCFS Order = "fcfs"
	// LCFS serves the latest arrival first.
	LCFS Order = "lcfs"
	// WSPT serves the smallest Cost first: Smith's weighted shortest
	// processing time with every weight 1 (priority already ranks above
	// the order), ties by earlier arrival.
	WSPT Order = "wspt"
	// Slack serves the least slack first: the earliest latest useful
	// start, Arrival + TTFT - PredictedTTFT (the last moment the request
	// can still be dispatched and meet its TTFT target, by the
	// prediction), ties by earlier arrival; items without a TTFT target
	// (Item.TTFT 0) after every item with one, first come first served
	// among themselves. llm-d's slo-deadline order is this with no
	// prediction: ReceivedTimestamp + x-slo-ttft-ms
	// (llm-d/llm-d-inference-scheduler,
	// pkg/epp/framework/plugins/flowcontrol/ordering/slodeadline/slo_deadline.go,
	// commit 520af47896e5f06e43d09aca281a1149187b0ffd); subtracting the
	// predicted TTFT serves first a long prompt that must start sooner
	// than a short one of the same deadline (least laxity first).
	Slack Order = "slack"
)

// DefaultQuantum is the base DRR quantum in tokens used when
// Config.Quantum is 0. See Config.Quantum.
const DefaultQuantum = 1

// maxQuantum bounds Weight × Quantum so deficits never overflow int64.
const maxQuantum = 1 << 52

// ClassConfig is one policy class.
type ClassConfig struct {
	// Name identifies the class in requests and in the config; non-empty
	// and unique within the queue.
	Name string
	// Weight is the class's share of dispatched cost relative to the other
	// backlogged classes; >= 1.
	Weight int
	// Order breaks ties of aged priority within the class: "fcfs"
	// (default when empty), "lcfs", "wspt" or "slack".
	Order Order
}

// Config configures a Queue.
type Config struct {
	// Classes lists the policy classes, at least one. Their order is the
	// initial round-robin order.
	Classes []ClassConfig
	// DefaultClass is the class of items that name none; "" means the
	// first class.
	DefaultClass string
	// Aging raises a waiting item's priority by one for every Aging
	// interval (on a shared grid: see README), so every item is dispatched
	// in bounded time. 0 is strict priority, which can starve low
	// priorities; the config loader warns about it.
	Aging time.Duration
	// MaxLen bounds the items held (waiting, plus expired ones not yet
	// returned by Expire); Push beyond it fails with ErrFull. 0 is
	// unbounded.
	MaxLen int
	// Quantum is the DRR quantum per unit of weight, in tokens of
	// scheduling cost: each round a class is credited Weight × Quantum.
	// 0 means DefaultQuantum (1 token). Pop skips rounds in which no class
	// can send in one step, so a small quantum costs nothing; the smaller
	// it is, the tighter DRR's fairness bound (max cost + 2 quanta) and
	// the finer the interleaving of classes.
	Quantum int64
}

// Item is one waiting request. The queue reads ID, Class, Priority, Cost,
// Arrival and DueAt at Push and ignores later changes to them.
type Item struct {
	// ID identifies the request; unique among the items held.
	ID string
	// Class names the policy class; "" means Config.DefaultClass.
	Class string
	// Priority ranks items within a class, higher first.
	Priority int
	// Cost is the scheduling cost in tokens, >= 1: the DRR charge and
	// WSPT's processing time.
	Cost int64
	// Arrival is when the request started waiting; not zero. Times are
	// compared in Unix nanoseconds (years 1678 to 2262).
	Arrival time.Time
	// DueAt is when the request expires if still waiting; zero for never.
	DueAt time.Time
	// TTFT is the request's time-to-first-token target left when it
	// joined the queue (its target less its time in the router before),
	// PredictedTTFT its predicted time to first token once dispatched;
	// read by the Slack order only. TTFT <= 0: no target (a target
	// already spent has a small positive TTFT: the caller keeps it).
	TTFT, PredictedTTFT time.Duration
	// Value is the caller's; the queue never reads it.
	Value any
}

// entry is the queue's record of one held item, with its sort keys copied
// at Push.
type entry struct {
	it      *Item
	id      string
	class   int32
	expired bool   // set aside by expiry, waiting for Expire
	keyHi   int64  // aged priority (see key), 128-bit two's complement
	keyLo   uint64 //
	arrival int64  // Unix ns
	due     int64  // Unix ns; valid when dueIdx >= 0
	cost    int64
	// start is the latest useful start (Slack: Arrival + TTFT -
	// PredictedTTFT, Unix ns); hasTTFT says the item has a TTFT target.
	start    int64
	hasTTFT  bool
	classIdx int // position in the class heap
	dueIdx   int // position in the due heap, -1 when none
}

// Queue holds waiting items. The zero value is not usable; call New.
type Queue struct {
	classes []*class
	byName  map[string]int32
	def     int32
	aging   int64 // ns; 0 = strict priority
	maxLen  int

	index   map[string]*entry
	due     heap.Heap[*entry] // newDueHeap
	expired []*entry          // set aside by Pop or Peek, returned by the next Expire
	live    int               // items Pop can return
	free    []*entry          // recycled entries

	drr drr
}

// New validates cfg and returns an empty queue. It reports every problem
// in cfg at once.
func New(cfg Config) (*Queue, error) {
	var errs []error
	if len(cfg.Classes) == 0 {
		errs = append(errs, errors.New("no classes, want at least one"))
	}
	if cfg.Aging < 0 {
		errs = append(errs, fmt.Errorf("aging %v, want >= 0", cfg.Aging))
	}
	if cfg.MaxLen < 0 {
		errs = append(errs, fmt.Errorf("max length %d, want >= 0", cfg.MaxLen))
	}
	base := cfg.Quantum
	if base == 0 {
		base = DefaultQuantum
	}
	if base < 0 || base > maxQuantum {
		errs = append(errs, fmt.Errorf("quantum %d tokens, want 1..%d (0 for the default)", cfg.Quantum, int64(maxQuantum)))
		base = DefaultQuantum
	}
	q := &Queue{
		byName: make(map[string]int32, len(cfg.Classes)),
		aging:  int64(cfg.Aging),
		maxLen: cfg.MaxLen,
		index:  make(map[string]*entry),
		due:    newDueHeap(),
	}
	for i, cc := range cfg.Classes {
		name := cc.Name
		if name == "" {
			errs = append(errs, fmt.Errorf("class %d: empty name", i))
			name = fmt.Sprintf("#%d", i)
		}
		if _, dup := q.byName[name]; dup && cc.Name != "" {
			errs = append(errs, fmt.Errorf("class %q: declared twice", name))
		}
		if cc.Weight < 1 {
			errs = append(errs, fmt.Errorf("class %q: weight %d, want >= 1", name, cc.Weight))
		} else if int64(cc.Weight) > maxQuantum/base {
			errs = append(errs, fmt.Errorf("class %q: weight %d × quantum %d tokens exceeds %d", name, cc.Weight, base, int64(maxQuantum)))
		}
		order := cc.Order
		switch order {
		case "":
			order = FCFS
		case FCFS, LCFS, WSPT, Slack:
		default:
			errs = append(errs, fmt.Errorf("class %q: unknown order %q, want one of %q, %q, %q, %q", name, cc.Order, FCFS, LCFS, WSPT, Slack))
		}
		q.byName[name] = int32(i)
		q.classes = append(q.classes, &class{
			name:    name,
			quantum: max(int64(cc.Weight), 1) * base,
			heap:    newClassHeap(order),
		})
	}
	if cfg.DefaultClass != "" {
		d, ok := q.byName[cfg.DefaultClass]
		if !ok {
			errs = append(errs, fmt.Errorf("default class %q: not declared (have %q)", cfg.DefaultClass, q.classNames()))
		}
		q.def = d
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("queue config: %w", errors.Join(errs...))
	}
	return q, nil
}

func (q *Queue) classNames() []string {
	names := make([]string, len(q.classes))
	for i, c := range q.classes {
		names[i] = c.name
	}
	slices.Sort(names)
	return names
}

// Push adds it to the queue. It fails with ErrInvalidItem, ErrUnknownClass,
// ErrDuplicate or ErrFull, wrapped with the item's id, and then holds
// nothing of it.
func (q *Queue) Push(it *Item) error {
	switch {
	case it == nil:
		return fmt.Errorf("queue: push nil item: %w", ErrInvalidItem)
	case it.ID == "":
		return fmt.Errorf("queue: push: empty id: %w", ErrInvalidItem)
	case it.Cost < 1:
		return fmt.Errorf("queue: push %q: cost %d tokens, want >= 1: %w", it.ID, it.Cost, ErrInvalidItem)
	case it.Arrival.IsZero():
		return fmt.Errorf("queue: push %q: zero arrival time: %w", it.ID, ErrInvalidItem)
	}
	ci := q.def
	if it.Class != "" {
		var ok bool
		if ci, ok = q.byName[it.Class]; !ok {
			return fmt.Errorf("queue: push %q: class %q (have %q): %w", it.ID, it.Class, q.classNames(), ErrUnknownClass)
		}
	}
	if _, dup := q.index[it.ID]; dup {
		return fmt.Errorf("queue: push %q: %w", it.ID, ErrDuplicate)
	}
	if q.maxLen > 0 && q.live+len(q.expired) >= q.maxLen {
		return fmt.Errorf("queue: push %q: %d items held: %w", it.ID, q.maxLen, ErrFull)
	}

	e := q.newEntry()
	e.it, e.id, e.class = it, it.ID, ci
	e.arrival = it.Arrival.UnixNano()
	e.cost = it.Cost
	if it.TTFT > 0 {
		e.hasTTFT = true
		e.start = satAdd(e.arrival, int64(it.TTFT)-int64(max(it.PredictedTTFT, 0)))
	}
	e.keyHi, e.keyLo = key(int64(it.Priority), e.arrival, q.aging)
	e.dueIdx = -1
	if !it.DueAt.IsZero() {
		e.due = it.DueAt.UnixNano()
		q.due.Push(e)
	}
	c := q.classes[ci]
	c.heap.Push(e)
	if c.heap.Len() == 1 {
		q.drr.activate(ci)
	}
	q.index[e.id] = e
	q.live++
	return nil
}

// Pop removes and returns the next item: the class chosen by weighted
// deficit round robin, then that class's first item by aged priority and
// order. It first sets aside every item whose DueAt <= now for the next
// Expire, so it never returns an expired item. It reports false when no
// live item waits.
func (q *Queue) Pop(now time.Time) (*Item, bool) {
	q.setAsideExpired(now)
	if q.live == 0 {
		return nil, false
	}
	off, rounds := q.drr.choose(q.classes)
	ci := q.drr.commit(q.classes, off, rounds)
	c := q.classes[ci]
	e := c.heap.At(0)
	c.deficit -= e.cost
	q.unlink(e)
	it := e.it
	delete(q.index, e.id)
	q.recycle(e)
	return it, true
}

// Peek returns what Pop(now) would return, without removing it or changing
// the round-robin state. Like Pop, it first sets expired items aside.
func (q *Queue) Peek(now time.Time) (*Item, bool) {
	q.setAsideExpired(now)
	if q.live == 0 {
		return nil, false
	}
	off, _ := q.drr.choose(q.classes)
	return q.classes[q.drr.at(off)].heap.At(0).it, true
}

// Remove removes and returns the item with this id (a client cancel),
// whether it is waiting or expired and not yet returned by Expire. It
// reports false for an id the queue does not hold.
func (q *Queue) Remove(id string) (*Item, bool) {
	e, ok := q.index[id]
	if !ok {
		return nil, false
	}
	delete(q.index, id)
	if e.expired {
		// Linear in the set-aside items, which only accumulate between a
		// Pop or Peek and the next Expire.
		i := slices.Index(q.expired, e)
		q.expired = slices.Delete(q.expired, i, i+1)
	} else {
		q.unlink(e)
	}
	it := e.it
	q.recycle(e)
	return it, true
}

// Expire removes every item whose DueAt <= now, together with those Pop and
// Peek set aside, appends them to out in order of DueAt (ties by ID) and
// returns the extended slice. The caller rejects them with a clear status.
func (q *Queue) Expire(now time.Time, out []*Item) []*Item {
	q.setAsideExpired(now)
	for i, e := range q.expired {
		out = append(out, e.it)
		delete(q.index, e.id)
		q.recycle(e)
		q.expired[i] = nil
	}
	q.expired = q.expired[:0]
	return out
}

// Len is the number of items Pop can still return: waiting items, not
// counting expired ones set aside for Expire.
func (q *Queue) Len() int { return q.live }

// ClassLen is Len for one class; 0 for a class the queue does not know.
func (q *Queue) ClassLen(name string) int {
	ci, ok := q.byName[name]
	if !ok {
		return 0
	}
	return q.classes[ci].heap.Len()
}

// setAsideExpired moves every waiting item with DueAt <= now from its class
// heap to q.expired, in due order.
func (q *Queue) setAsideExpired(now time.Time) {
	if q.due.Len() == 0 {
		return
	}
	t := now.UnixNano()
	for q.due.Len() > 0 && q.due.At(0).due <= t {
		e := q.due.At(0)
		q.unlink(e)
		e.expired = true
		q.expired = append(q.expired, e)
	}
}

// unlink takes a waiting e out of its class heap and the due heap; a class
// left empty leaves the round robin and loses its deficit.
func (q *Queue) unlink(e *entry) {
	c := q.classes[e.class]
	c.heap.Remove(e.classIdx)
	if e.dueIdx >= 0 {
		q.due.Remove(e.dueIdx)
	}
	if c.heap.Len() == 0 {
		c.deficit = 0
		q.drr.deactivate(e.class)
	}
	q.live--
}

func (q *Queue) newEntry() *entry {
	if n := len(q.free); n > 0 {
		e := q.free[n-1]
		q.free[n-1] = nil
		q.free = q.free[:n-1]
		return e
	}
	return new(entry)
}

func (q *Queue) recycle(e *entry) {
	*e = entry{}
	q.free = append(q.free, e)
}

// key is an item's static aged priority: priority − ⌊arrival/aging⌋ as an
// exact 128-bit integer, or the priority alone without aging. Items in a
// class all age at the same rate, so comparing effective priorities
// p + ⌊now/aging⌋ − ⌊arrival/aging⌋ at any now is comparing keys.
func key(priority, arrival, aging int64) (hi int64, lo uint64) {
	var tick int64
	if aging > 0 {
		tick = arrival / aging
		if arrival%aging != 0 && arrival < 0 {
			tick-- // floor, not truncation
		}
	}
	return sub128(priority, tick)
}

// satAdd returns a + b, saturated at the int64 bounds.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return 1<<63 - 1
	case b < 0 && s > a:
		return -1 << 63
	}
	return s
}

// sub128 returns a − b exactly, as a 128-bit two's-complement integer.
func sub128(a, b int64) (hi int64, lo uint64) {
	lo = uint64(a) - uint64(b)
	var borrow int64
	if uint64(a) < uint64(b) {
		borrow = 1
	}
	return a>>63 - b>>63 - borrow, lo
}

// cmp128 compares two 128-bit two's-complement integers.
func cmp128(ahi int64, alo uint64, bhi int64, blo uint64) int {
	switch {
	case ahi != bhi:
		if ahi < bhi {
			return -1
		}
		return 1
	case alo < blo:
		return -1
	case alo > blo:
		return 1
	}
	return 0
}
