package sim

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Request is one inference request submitted to a Worker.
type Request struct {
	// ID identifies the request in Events; the worker does not interpret it.
	ID int
	// InputLength is the prompt length in tokens; must be >= 1.
	InputLength int
	// OutputLength is the number of tokens to generate; 0 is treated as 1
	// (the prefill always samples one token), negative is an error.
	OutputLength int
	// PrefixHashes holds one chained hash per PrefixBlockTokens-token prompt
	// block: hash k identifies blocks 0..k together (e.g. Mooncake hash_ids
	// folded with router/prefix.ChainHashes), so equal hashes mean an equal
	// prefix. Engine block j of block k is keyed by (PrefixHashes[k], j)
	// (README.md, Trace blocks). The last block covers the remaining r tokens and
	// contributes ⌊r/BlockSize⌋ cacheable engine blocks; tokens beyond
	// len(PrefixHashes) blocks and all output tokens get private, never
	// shared blocks. May be nil (no prefix caching, e.g. Azure traces). The
	// worker keeps the slice until the request completes and never modifies
	// it.
	PrefixHashes []uint64
	// PrefixBlockTokens is the number of tokens per PrefixHashes entry
	// (trace.MooncakeBlockTokens = 512 for Mooncake). Required, as a positive
	// multiple of Config.BlockSize, when PrefixHashes is non-empty.
	PrefixBlockTokens int
	// KVTransferred marks a request handed over by a prefill worker in
	// disaggregated serving: the KV of its whole prompt has been transferred
	// into this (decode) worker and its first output token was already
	// sampled there. OutputLength still counts every output token, that
	// first one included, so it must be >= 2; the worker decodes the other
	// OutputLength−1.
	//
	// At admission the request takes blocks for its prompt plus the token it
	// decodes first, ceil((InputLength+1)/BlockSize), and is scheduled as a
	// decode from its first step: it computes no prefill, and the step-time
	// model charges it one decode token attending to InputLength+1 tokens
	// (then one more per step), like any decode. Its FirstToken event marks
	// the end of its first decode step here, so the second output token of
	// the request; its CachedTokens is 0.
	//
	// The transferred blocks are private: they are not published to the
	// prefix cache and PrefixHashes is ignored. A decode worker is never
	// sent a prefill, and the transfer is charged in full whatever it
	// holds, so publishing could only change which blocks eviction takes
	// first, not any result; keeping them private also keeps the decode
	// pool's cache statistics meaning "nothing reused". If the request is
	// preempted, the transferred KV is lost and it recomputes prompt and
	// generated tokens locally as an ordinary prefill (vLLM's recompute
	// preemption; the worker cannot fetch the KV again).
	KVTransferred bool
	// Generated is the output tokens already generated for the request
	// elsewhere, before its engine failed (a migrated continuation,
	// router/migrate): the worker computes the prompt and these tokens
	// as one prefill, as it recomputes a preempted request (the prefix
	// cache can serve only the prompt's blocks: PrefixHashes cover the
	// prompt, the generated tokens get private blocks), then samples the
	// remaining OutputLength−Generated tokens. Its FirstToken event is
	// the first token sampled here (token Generated+1 of the answer).
	// 0 <= Generated < OutputLength; not with KVTransferred.
	Generated int
}

// EventKind says what happened to a request.
type EventKind uint8

const (
	// FirstToken: the step that finished the request's prefill ended; At is
	// its time to first token measured from the simulation epoch. For a
	// KVTransferred request, which has no prefill here, it is the end of its
	// first decode step: the first token this worker sampled, which is the
	// request's second output token.
	FirstToken EventKind = iota + 1
	// Completed: the step that sampled the last output token ended; the
	// request's KV blocks are freed (cached prefix blocks stay evictable).
	Completed
)

// String returns "FirstToken" or "Completed".
func (k EventKind) String() string {
	switch k {
	case FirstToken:
		return "FirstToken"
	case Completed:
		return "Completed"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is something that happened to a request at the end of a step.
type Event struct {
	Kind      EventKind
	Worker    int           // index of the worker in its Cluster (0 for a lone Worker)
	RequestID int           // Request.ID
	At        time.Duration // end of the step
	// CachedTokens, on FirstToken, is the number of prompt tokens served
	// from the prefix cache when the request was scheduled (a multiple of
	// BlockSize, at most InputLength−1; if it was preempted before its first
	// token, the hit of the re-admission that produced it). 0 on Completed.
	CachedTokens int
	// ScheduledAt, on FirstToken, is the start of the step that first
	// admitted the request: At minus ScheduledAt is prefill time, and
	// ScheduledAt minus the submit time is queueing in the engine.
	ScheduledAt time.Duration
}

// Stats are cumulative counters of one worker.
type Stats struct {
	Steps    int64         // engine steps run
	BusyTime time.Duration // sum of step durations
	// Preemptions counts recompute preemptions (a running request evicted
	// to free KV, its progress discarded).
	Preemptions int64
	// EvictedBlocks counts cached prefix blocks (BlockSize tokens each)
	// reclaimed by the LRU to make room.
	EvictedBlocks int64
	// CacheHitTokens sums the prompt tokens served from the prefix cache at
	// each admission, re-admissions after preemption included.
	CacheHitTokens int64
	// PrefillTokens counts tokens computed in prefill chunks (recomputation
	// included); DecodeTokens counts decode tokens.
	PrefillTokens, DecodeTokens int64
	// TransferredTokens counts the prompt tokens of KVTransferred requests
	// at their first admission: KV this worker received instead of
	// computing.
	TransferredTokens    int64
	Submitted, Completed int64 // requests
	// Aborted counts requests removed by Abort before completing.
	Aborted int64
	// Failures counts Fail calls; Cut the requests they removed.
	Failures, Cut int64
}

// Load is a worker's instantaneous state, for routers that read engine
// metrics (queue depth and KV usage, as vLLM exports them).
type Load struct {
	Running int // requests scheduled (admitted, holding KV)
	Waiting int // requests queued for admission, preempted ones included
	// UsedBlocks are blocks held by running requests (private or pinned
	// cached blocks); FreeBlocks = TotalKVBlocks − UsedBlocks, of which
	// CachedBlocks still hold evictable prefix-cache content.
	UsedBlocks, FreeBlocks, CachedBlocks int
}

// seq is a request inside the worker.
type seq struct {
	id          int
	prompt      int // L
	output      int // O >= 1
	hashes      []uint64
	groups      int // cacheable prefix groups: min(len(hashes), ceil(L/groupTokens))
	groupTokens int
	computed    int           // tokens whose KV is computed
	generated   int           // output tokens sampled
	alloc       int           // engine blocks held
	private     int           // held blocks not published in a cache node
	cached      int           // prompt tokens hit at first admission
	scheduledAt time.Duration // start of the step that first admitted it
	lastToken   time.Duration // when its latest token was sampled
	scheduled   bool
	transferred bool // KVTransferred and not yet admitted (a preempted one recomputes)
	slots       []int32
	prefilling  bool
	first       bool
	done        bool
}

// Slot values besides node indices.
const (
	slotPrivate = -1 // computed into private blocks (a duplicate, or no chain)
	slotCreate  = -2 // lookup found nothing: create the node at admission
)

// Worker is one simulated engine (README.md, Model and Trace blocks). Steps run back to
// back while the worker has work; a step's batch is formed when it starts,
// by the vLLM V1 rules: running requests first in admission order (one
// decode token each, partial prefills continue with up to the remaining
// token budget), preempting the newest running request, recompute style,
// whenever KV blocks run out; then, if nothing was preempted, waiting
// requests FCFS while the budget, MaxNumSeqs and free blocks allow, each
// looking up its prefix in the cache once at admission.
//
// Time only moves forward: Advance runs the steps that end by a given time,
// Submit queues a request at a time not before the last one used. A step
// that would start exactly at the time of the last Advance is formed lazily,
// so requests submitted at that same instant join it.
type Worker struct {
	cfg     Config
	k       timingPS
	index   int
	kv      *kvCache
	bs      int // BlockSize
	seqs    []seq
	free    []int32 // free seq slots
	running []int32 // running, admission order
	wait    deque
	sched   []sched
	stats   Stats
	now     time.Duration // latest time seen by Advance or Submit
	ready   time.Duration // when the next step may start
	busy    bool          // a step is in flight
	start   time.Duration // in-flight step start
	end     time.Duration // in-flight step end
	noFast  bool          // tests: disable the decode fast path
	// tokenGap, when set, receives every inter-token latency (OnTokenGap).
	tokenGap func(gap time.Duration, n int)
}

// OnTokenGap sets f to receive the worker's inter-token latencies (ITL):
// each time a request that already has a token here samples another, the
// time since its previous one, f(gap, n) standing for n tokens with the
// same gap. The gaps are those between the ends of the steps that
// sampled the tokens, so a request preempted in between counts the whole
// wait in one gap. A request's first token on this worker has no gap (its
// TTFT, or in disaggregated serving the decode worker's first token after
// the KV transfer). f is called from Advance and Drain, in time order;
// nil stops the calls.
func (w *Worker) OnTokenGap(f func(gap time.Duration, n int)) { w.tokenGap = f }

type sched struct {
	seq int32
	n   int32
}

// NewWorker returns an idle worker at time 0 with an empty cache.
// It returns an error wrapping ErrInvalidConfig if cfg is invalid.
func NewWorker(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Buffers and the cache's tables grow as requests arrive: a fleet of
	// thousands of mostly idle simulated workers costs little to build.
	return &Worker{
		cfg: cfg,
		k:   cfg.Timing.compile(),
		kv:  newKVCache(cfg.TotalKVBlocks),
		bs:  cfg.BlockSize,
	}, nil
}

// Config returns the worker's configuration.
func (w *Worker) Config() Config { return w.cfg }

// Stats returns the cumulative counters.
func (w *Worker) Stats() Stats {
	s := w.stats
	s.EvictedBlocks = w.kv.evicted
	return s
}

// Load returns the current queue and KV occupancy.
func (w *Worker) Load() Load {
	used := w.kv.total - w.kv.available()
	return Load{
		Running: len(w.running), Waiting: w.wait.len(),
		UsedBlocks: used, FreeBlocks: w.kv.total - used,
		CachedBlocks: w.kv.lruBlocks - w.kv.lruPrivate,
	}
}

func (w *Worker) hasWork() bool { return len(w.running) > 0 || w.wait.len() > 0 }

func (w *Worker) blocksFor(tokens int) int { return (tokens + w.bs - 1) / w.bs }

// Submit queues r at time now (it joins the back of the waiting queue).
// If the worker is idle, a step starts at now; requests submitted at the
// same instant share it. Call Advance(now) first so that steps ending by
// now are run; Submit itself never emits events.
//
// Errors: ErrTimeWentBackwards if now is before the latest time given to
// Advance or Submit; ErrInvalidRequest (including a KVTransferred request
// with OutputLength < 2) or ErrRequestTooLarge (when
// ceil((InputLength+OutputLength−1)/BlockSize) > TotalKVBlocks) for a bad
// request. A rejected request leaves the worker unchanged.
func (w *Worker) Submit(now time.Duration, r *Request) error {
	if now < w.now {
		return fmt.Errorf("%w: submit at %v after %v", ErrTimeWentBackwards, now, w.now)
	}
	if r == nil || r.InputLength < 1 || r.OutputLength < 0 {
		return fmt.Errorf("%w: input %d tokens, output %d tokens", ErrInvalidRequest, lenOr(r, true), lenOr(r, false))
	}
	if r.Generated < 0 || (r.Generated > 0 && (r.KVTransferred || r.Generated >= r.OutputLength)) {
		return fmt.Errorf("%w: %d tokens generated before, output %d tokens (want 0 <= generated < output, not KV-transferred)",
			ErrInvalidRequest, r.Generated, r.OutputLength)
	}
	if r.KVTransferred && r.OutputLength < 2 {
		return fmt.Errorf("%w: KV-transferred request with output %d tokens, want >= 2 (its first token was sampled by the prefill worker)",
			ErrInvalidRequest, r.OutputLength)
	}
	out := max(r.OutputLength, 1)
	groups := 0
	if len(r.PrefixHashes) > 0 && !r.KVTransferred {
		g := r.PrefixBlockTokens
		if g <= 0 || g%w.bs != 0 {
			return fmt.Errorf("%w: PrefixBlockTokens %d is not a positive multiple of BlockSize %d", ErrInvalidRequest, g, w.bs)
		}
		if w.kv.copies && g != w.bs {
			return fmt.Errorf("%w: PrefixBlockTokens %d with block copies tracked, want BlockSize %d", ErrInvalidRequest, g, w.bs)
		}
		groups = min(len(r.PrefixHashes), (r.InputLength+g-1)/g)
	}
	if r.InputLength > math.MaxInt32-out || w.blocksFor(r.InputLength+out-1) > w.cfg.TotalKVBlocks {
		return fmt.Errorf("%w: %d+%d tokens, %d blocks of %d tokens", ErrRequestTooLarge,
			r.InputLength, out, w.cfg.TotalKVBlocks, w.bs)
	}
	if !w.busy {
		if w.hasWork() {
			if w.ready < now {
				w.plan(w.ready) // the step started before now, without r
			}
		} else {
			w.ready = now
		}
	}
	w.now = now
	var i int32
	if n := len(w.free); n > 0 {
		i = w.free[n-1]
		w.free = w.free[:n-1]
	} else {
		w.seqs = append(w.seqs, seq{})
		i = int32(len(w.seqs) - 1)
	}
	s := &w.seqs[i]
	slots := s.slots[:0]
	if cap(slots) < groups {
		slots = make([]int32, 0, groups)
	}
	*s = seq{
		id: r.ID, prompt: r.InputLength, output: out,
		groups: groups, slots: slots[:groups],
	}
	if r.KVTransferred {
		s.transferred = true
		s.generated = 1 // sampled by the prefill worker
	} else {
		s.hashes, s.groupTokens = r.PrefixHashes, r.PrefixBlockTokens
		s.generated = r.Generated
	}
	w.wait.pushBack(i)
	w.stats.Submitted++
	return nil
}

func lenOr(r *Request, in bool) int {
	if r == nil {
		return 0
	}
	if in {
		return r.InputLength
	}
	return r.OutputLength
}

// NextEvent returns the end of the step in flight and true, or false when
// the worker is idle. If a step is due but not yet formed (see Worker), it
// is formed now, so later submissions at the same instant wait for the
// following step.
func (w *Worker) NextEvent() (time.Duration, bool) {
	if !w.busy && w.hasWork() {
		w.plan(w.ready)
	}
	return w.end, w.busy
}

// Advance runs every step that ends at or before until, appending the
// events of each step in order (by time, then by the request's position in
// the running batch) to out, and returns the extended slice. A step that
// would start exactly at until is left unformed (see Worker). Advancing to
// a time earlier than the worker's latest time is a no-op. Advance does not
// allocate in steady state beyond growing out.
func (w *Worker) Advance(until time.Duration, out []Event) []Event {
	out = w.run(until, out)
	w.now = max(w.now, until)
	return out
}

// Drain runs the worker until it has no work left, appending all events.
// The worker's time becomes the end of its last step (or stays, if later),
// so requests can still be submitted after a drain.
func (w *Worker) Drain(out []Event) []Event {
	out = w.run(math.MaxInt64, out)
	w.now = max(w.now, w.ready)
	return out
}

func (w *Worker) run(until time.Duration, out []Event) []Event {
	for {
		if !w.busy {
			if !w.hasWork() || (w.ready >= until && until != math.MaxInt64) {
				break
			}
			if !w.noFast && w.decodeRun(until) {
				continue
			}
			w.plan(w.ready)
		}
		if w.end > until {
			break
		}
		out = w.finish(out)
	}
	return out
}

// Abort removes the request with ID id, running or waiting, as vLLM does
// when its client disconnects: a running request's KV blocks are freed like
// a completed request's (private blocks, then prefix groups last to first;
// the prefix blocks it computed and published stay cached and evictable),
// and the request emits no further events. A step in flight that includes
// it still ends when planned, its duration fixed when it started; the
// request just takes no part in its results. A waiting request holds no
// blocks and simply leaves the queue.
//
// Abort reports whether it found the request: false for an ID never
// submitted, already completed or already aborted. With several requests of
// the same ID it removes the earliest admitted running one, else the first
// waiting one. It acts at the worker's latest time, so call Advance(now)
// first to deliver the events due by now. Cost: O(running + waiting).
func (w *Worker) Abort(id int) bool {
	for i, idx := range w.running {
		s := &w.seqs[idx]
		if s.id != id {
			continue
		}
		if w.busy {
			w.sched = slices.DeleteFunc(w.sched, func(sc sched) bool { return sc.seq == idx })
		}
		w.release(s)
		w.running = slices.Delete(w.running, i, i+1)
		w.retire(idx)
		return true
	}
	for i := 0; i < w.wait.len(); i++ {
		if idx := w.wait.at(i); w.seqs[idx].id == id {
			w.wait.removeAt(i)
			w.retire(idx)
			return true
		}
	}
	return false
}

// retire frees the slot of an aborted request.
func (w *Worker) retire(idx int32) {
	s := &w.seqs[idx]
	s.hashes, s.done = nil, true
	w.free = append(w.free, idx)
	w.stats.Aborted++
}

// lookup walks the request's prefix groups through the cache (one map
// lookup per group, not per engine block) and returns the engine blocks
// hit, capped at (numTokens−1)/BlockSize so the last block is always
// computed (vllm/v1/core/kv_cache_manager.py), and the blocks of hit nodes
// that sit in the LRU (they leave the free pool when referenced). If slots
// is non-nil it records, per group, the node to reference, slotCreate or
// slotPrivate.
func (w *Worker) lookup(s *seq, numTokens int, slots []int32) (hit, evictable int) {
	capBlocks := (numTokens - 1) / w.bs
	if w.kv.copies {
		return w.lookupCopies(s, capBlocks, slots)
	}
	per := s.groupTokens / w.bs
	broken := false
	for g := 0; g < s.groups; g++ {
		i, ok := w.kv.index[s.hashes[g]]
		if broken {
			if slots == nil {
				break
			}
			if ok {
				slots[g] = slotPrivate
			} else {
				slots[g] = slotCreate
			}
			continue
		}
		if !ok {
			if slots != nil {
				slots[g] = slotCreate
			}
			broken = true
			continue
		}
		if slots != nil {
			slots[g] = i
		}
		nd := &w.kv.nodes[i]
		full := min(per, (s.prompt-g*s.groupTokens)/w.bs)
		h := min(int(nd.blocks), full, capBlocks-hit)
		hit += h
		if nd.refs == 0 {
			evictable += int(nd.blocks)
		}
		if h < full {
			broken = true
		}
	}
	return hit, evictable
}

// lookupCopies is lookup with block copies tracked (one engine block per
// group): the leading cached blocks up to capBlocks are hits; every block
// from the first miss on, the capped one included, is computed into a new
// block that becomes its own cached copy (slotCreate), as vLLM's
// allocate_slots and cache_full_blocks do.
func (w *Worker) lookupCopies(s *seq, capBlocks int, slots []int32) (hit, evictable int) {
	for g := 0; g < s.groups; g++ {
		i, ok := w.kv.index[s.hashes[g]]
		if !ok || hit >= capBlocks {
			if slots == nil {
				break
			}
			for ; g < s.groups; g++ {
				slots[g] = slotCreate
			}
			break
		}
		if slots != nil {
			slots[g] = i
		}
		hit++
		if w.kv.nodes[i].refs == 0 {
			evictable++
		}
	}
	return hit, evictable
}

// TrackBlockCopies makes the worker's prefix cache behave as vLLM's block
// pool does without deduplication (vllm/v1/core/block_pool.py,
// BlockHashToBlockMap: "We currently don't de-duplicate the blocks in the
// cache"): every block a request computes becomes a cached copy of its
// hash, reported by its own KVBlockStored and, when evicted, its own
// KVBlockRemoved, even when another copy of the hash is cached (the last
// block of a fully cached, block-aligned prompt is always recomputed, so
// such a prompt adds a second copy); a hash hits while any copy is
// cached. Blocks are cached when the step that computes them is scheduled
// (vLLM's allocate_slots caches them then), so a request admitted later
// in the same step hits them, and KVBlockStored's At is the step's start.
// Requests must then use PrefixBlockTokens equal to BlockSize (one group
// per engine block). Call it before the first Submit: it returns an
// error wrapping ErrInvalidConfig on a worker that has taken requests.
func (w *Worker) TrackBlockCopies() error {
	if w.stats.Submitted > 0 {
		return fmt.Errorf("%w: block copies tracked after %d requests were submitted", ErrInvalidConfig, w.stats.Submitted)
	}
	w.kv.copies = true
	return nil
}

// CachedBlocks calls f once for every prefix group the worker's cache
// holds now (at least one of its engine blocks cached), with the group's
// chained hash (a Request.PrefixHashes entry, what KVEvent.Hash names)
// and its cached copies: 1 without TrackBlockCopies, with it the copies
// of the hash each request computed (vLLM's block pool without
// deduplication). The order is unspecified. It is the engine's own view
// of its cache, independent of the KV events, for checking a consumer of
// the events against. Cost: one pass over the cache's index; f must not
// call the worker.
func (w *Worker) CachedBlocks(f func(hash uint64, copies int)) {
	c := w.kv
	for key, i := range c.index {
		n := 0
		if c.nodes[i].blocks > 0 {
			n++
		}
		for _, j := range c.more[key] {
			if c.nodes[j].blocks > 0 {
				n++
			}
		}
		if n > 0 {
			f(key, n)
		}
	}
}

// CachedPrefixTokens returns how many prompt tokens of r a fresh admission
// would serve from this worker's cache now (a multiple of BlockSize, at most
// InputLength−1), without changing anything. It lets a replay compare a
// router's belief with the engine's truth.
func (w *Worker) CachedPrefixTokens(r *Request) int {
	if r == nil || r.InputLength < 1 || len(r.PrefixHashes) == 0 ||
		r.PrefixBlockTokens <= 0 || r.PrefixBlockTokens%w.bs != 0 {
		return 0
	}
	g := r.PrefixBlockTokens
	s := seq{prompt: r.InputLength, hashes: r.PrefixHashes, groupTokens: g,
		groups: min(len(r.PrefixHashes), (r.InputLength+g-1)/g)}
	hit, _ := w.lookup(&s, r.InputLength, nil)
	return hit * w.bs
}

// admit references the looked-up nodes and allocates the first chunk.
func (w *Worker) admit(s *seq, hit, newBlocks int) {
	kv := w.kv
	for g, i := range s.slots {
		switch {
		case i >= 0:
			kv.ref(i)
		case i == slotCreate && kv.copies:
			s.slots[g] = kv.create(s.hashes[g]) // a new copy
		case i == slotCreate:
			if _, ok := kv.index[s.hashes[g]]; ok {
				s.slots[g] = slotPrivate // repeated hash within the request
			} else {
				s.slots[g] = kv.create(s.hashes[g])
			}
		}
	}
	kv.take(newBlocks)
	s.alloc = hit + newBlocks
	s.private = newBlocks
	s.computed = hit * w.bs
	s.prefilling = true
}

// admitTransferred allocates the blocks of a KVTransferred request, all
// private, and marks its prompt computed: it decodes from its first step.
func (w *Worker) admitTransferred(s *seq, blocks int) {
	w.kv.take(blocks)
	s.alloc, s.private = blocks, blocks
	s.computed = s.prompt
	s.transferred = false // a later preemption recomputes locally
	w.stats.TransferredTokens += int64(s.prompt)
}

// release frees a request's blocks tail-first: its private blocks, then its
// prefix groups from last to first (docs.vllm.ai design/prefix_caching).
func (w *Worker) release(s *seq) {
	w.kv.freePrivate(s.private)
	for g := len(s.slots) - 1; g >= 0; g-- {
		if i := s.slots[g]; i >= 0 {
			w.kv.unref(i)
		}
		s.slots[g] = slotPrivate
	}
	s.private, s.alloc, s.computed = 0, 0, 0
}

// plan forms the step starting at start and marks it in flight. Blocks are
// allocated and preemptions done now, as vLLM does at schedule time.
func (w *Worker) plan(start time.Duration) {
	w.kv.at = start
	budget := w.cfg.MaxNumBatchedTokens
	w.sched = w.sched[:0]
	var (
		d, chunks    int
		ctx          int64
		ptok, pairs2 int64
		preempted    bool
	)
	for i := 0; i < len(w.running); i++ {
		idx := w.running[i]
		s := &w.seqs[idx]
		n := min(s.prompt+s.generated-s.computed, budget)
		if n == 0 {
			continue
		}
		if need := w.blocksFor(s.computed+n) - s.alloc; need > 0 {
			for need > w.kv.available() {
				victim := w.running[len(w.running)-1]
				w.running = w.running[:len(w.running)-1]
				w.preempt(victim)
				preempted = true
				if victim == idx {
					break
				}
			}
			if len(w.running) <= i { // preempted itself
				break
			}
			w.kv.take(need)
			s.alloc += need
			s.private += need
		}
		w.sched = append(w.sched, sched{idx, int32(n)})
		budget -= n
		if w.kv.copies && s.prefilling && s.groups > 0 && s.computed < s.prompt {
			w.publish(s, s.computed, s.computed+n)
		}
		if s.prefilling {
			chunks++
			ptok += int64(n)
			pairs2 += int64(n) * int64(2*s.computed+n)
		} else {
			d++
			ctx += int64(s.computed + 1)
		}
	}
	// vLLM skips admission in a step that preempted; we admit anyway when
	// the step would otherwise be empty (vLLM's next step, same instant).
	if !preempted || len(w.sched) == 0 {
		for w.wait.len() > 0 && len(w.running) < w.cfg.MaxNumSeqs && budget > 0 {
			idx := w.wait.front()
			s := &w.seqs[idx]
			if s.transferred {
				// The prompt's KV is here: take its blocks and the first
				// decode token's, and decode in this step.
				need := w.blocksFor(s.prompt + 1)
				if need > w.kv.available() {
					break
				}
				w.admitTransferred(s, need)
				w.wait.popFront()
				w.running = append(w.running, idx)
				if !s.scheduled {
					s.scheduled, s.scheduledAt = true, start
				}
				w.sched = append(w.sched, sched{idx, 1})
				budget--
				d++
				ctx += int64(s.computed + 1)
				continue
			}
			numTokens := s.prompt + s.generated
			hit, evictable := w.lookup(s, numTokens, s.slots)
			n := min(numTokens-hit*w.bs, budget)
			need := w.blocksFor(hit*w.bs+n) - hit
			if need+evictable > w.kv.available() {
				break
			}
			w.admit(s, hit, need)
			w.wait.popFront()
			w.running = append(w.running, idx)
			if !s.first {
				s.cached = hit * w.bs
			}
			if !s.scheduled {
				s.scheduled, s.scheduledAt = true, start
			}
			w.stats.CacheHitTokens += int64(hit * w.bs)
			if w.kv.copies && s.groups > 0 {
				w.publish(s, s.computed, s.computed+n)
			}
			w.sched = append(w.sched, sched{idx, int32(n)})
			budget -= n
			chunks++
			ptok += int64(n)
			pairs2 += int64(n) * int64(2*s.computed+n)
		}
	}
	if len(w.sched) == 0 {
		// Unreachable: a request that fits the KV cache can always run
		// once everything newer is preempted.
		panic("sim: internal error: empty step with pending work")
	}
	dur := w.k.stepNS(d, ctx, chunks, ptok, pairs2)
	w.busy, w.start, w.end = true, start, start+dur
	w.stats.PrefillTokens += ptok
	w.stats.DecodeTokens += int64(d)
}

// preempt frees a running request for recomputation and puts it at the
// front of the waiting queue (vLLM V1 preemption, newest first).
func (w *Worker) preempt(idx int32) {
	s := &w.seqs[idx]
	w.release(s)
	s.prefilling = false
	w.wait.pushFront(idx)
	w.stats.Preemptions++
}

// finish applies the step in flight: advances every scheduled request,
// publishes newly computed prefix blocks, samples tokens and emits events.
func (w *Worker) finish(out []Event) []Event {
	at := w.end
	completed := false
	for _, sc := range w.sched {
		s := &w.seqs[sc.seq]
		c0 := s.computed
		s.computed += int(sc.n)
		if s.prefilling && s.groups > 0 && c0 < s.prompt && !w.kv.copies {
			w.publish(s, c0, s.computed)
		}
		if s.computed != s.prompt+s.generated {
			continue // partial prefill: no token sampled
		}
		s.generated++
		s.prefilling = false
		if s.first && w.tokenGap != nil {
			w.tokenGap(at-s.lastToken, 1)
		}
		s.lastToken = at
		if !s.first {
			s.first = true
			out = append(out, Event{Kind: FirstToken, Worker: w.index, RequestID: s.id, At: at, CachedTokens: s.cached, ScheduledAt: s.scheduledAt})
		}
		if s.generated >= s.output {
			out = append(out, Event{Kind: Completed, Worker: w.index, RequestID: s.id, At: at})
			w.release(s)
			s.done = true
			completed = true
			w.stats.Completed++
		}
	}
	if completed {
		j := 0
		for _, idx := range w.running {
			if s := &w.seqs[idx]; s.done {
				s.hashes = nil
				w.free = append(w.free, idx)
			} else {
				w.running[j] = idx
				j++
			}
		}
		w.running = w.running[:j]
	}
	w.stats.Steps++
	w.stats.BusyTime += w.end - w.start
	w.busy = false
	w.ready = at
	return out
}

// publish moves the full prompt blocks among tokens [c0, c1) of s from
// the request's private blocks into the cache nodes it references (vLLM
// caches a block once it is full): the tokens a step computed, at its end,
// or with block copies tracked the tokens it will compute, when it is
// scheduled. Without copies, blocks another request published first stay
// private duplicates; with copies every node s references is its own.
func (w *Worker) publish(s *seq, c0, c1 int) {
	per := s.groupTokens / w.bs
	b0 := c0 / w.bs                // full blocks before the step
	b1 := min(c1, s.prompt) / w.bs // after
	if b1 <= b0 {
		return
	}
	for g := b0 / per; g <= (b1-1)/per && g < s.groups; g++ {
		i := s.slots[g]
		if i < 0 {
			continue
		}
		nd := &w.kv.nodes[i]
		full := int32(min(per, b1-g*per))
		if full > nd.blocks {
			s.private -= int(full - nd.blocks)
			if nd.blocks == 0 {
				if w.kv.copies {
					w.kv.indexAdd(nd.key, i)
				}
				if w.kv.hook != nil {
					w.stored(s, g, nd.key)
				}
			}
			nd.blocks = full
		}
	}
}

// stored reports group g of s, just cached, to the hook.
func (w *Worker) stored(s *seq, g int, key uint64) {
	at := w.end
	if w.kv.copies {
		at = w.kv.at // cached when the step was scheduled
	}
	ev := KVEvent{Kind: KVBlockStored, Worker: w.index, At: at, Hash: key,
		RequestID: s.id, Group: g, Tokens: s.groupTokens}
	if g > 0 {
		ev.Parent = s.hashes[g-1]
	}
	w.kv.hook(ev)
}

// decodeRun is the fast path for a batch of pure decodes with nothing
// waiting: while no request needs a new block, completes, or the budget
// binds, consecutive steps differ only in total context (+D per step), so
// they are run in O(1) each and applied to the requests at once. The
// durations are computed by the same integer formula as plan, so results
// are identical to stepping one by one. It reports whether it ran a step.
func (w *Worker) decodeRun(until time.Duration) bool {
	if w.wait.len() > 0 || len(w.running) > w.cfg.MaxNumBatchedTokens {
		return false
	}
	k := math.MaxInt
	var ctx int64
	for _, idx := range w.running {
		s := &w.seqs[idx]
		if s.prefilling {
			return false
		}
		k = min(k, s.alloc*w.bs-s.computed, s.output-s.generated-1)
		ctx += int64(s.computed + 1)
	}
	if k <= 0 {
		return false
	}
	d := len(w.running)
	t := w.ready
	var t0 time.Duration // the first step's end
	j := 0
	for ; j < k; j++ {
		end := t + w.k.stepNS(d, ctx+int64(j*d), 0, 0, 0)
		if end > until {
			break
		}
		if j > 0 && w.tokenGap != nil {
			w.tokenGap(end-t, d) // every request's gap: the step
		}
		t = end
		if j == 0 {
			t0 = end
		}
	}
	if j == 0 {
		return false
	}
	// The first step's gap is since each request's own last token: for
	// those that decoded in the step before (nearly all), the step alone,
	// reported at once.
	stepped := 0
	for _, idx := range w.running {
		s := &w.seqs[idx]
		switch {
		case w.tokenGap == nil:
		case s.lastToken == w.ready:
			stepped++
		default:
			w.tokenGap(t0-s.lastToken, 1)
		}
		s.lastToken = t
		s.computed += j
		s.generated += j
	}
	if stepped > 0 {
		w.tokenGap(t0-w.ready, stepped)
	}
	w.stats.Steps += int64(j)
	w.stats.DecodeTokens += int64(j * d)
	w.stats.BusyTime += t - w.ready
	w.ready = t
	return true
}

// deque is a ring buffer of seq indices.
type deque struct {
	buf        []int32
	head, size int
}

func (q *deque) len() int { return q.size }

func (q *deque) grow() {
	n := max(16, 2*len(q.buf))
	b := make([]int32, n)
	for i := 0; i < q.size; i++ {
		b[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = b, 0
}

func (q *deque) pushBack(v int32) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.size)%len(q.buf)] = v
	q.size++
}

func (q *deque) pushFront(v int32) {
	if q.size == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = v
	q.size++
}

func (q *deque) front() int32 { return q.buf[q.head] }

// at returns the i-th element from the front (0 <= i < len).
func (q *deque) at(i int) int32 { return q.buf[(q.head+i)%len(q.buf)] }

// removeAt removes the i-th element from the front, keeping the order.
func (q *deque) removeAt(i int) {
	for j := i; j < q.size-1; j++ {
		q.buf[(q.head+j)%len(q.buf)] = q.buf[(q.head+j+1)%len(q.buf)]
	}
	q.size--
}

func (q *deque) popFront() {
	q.head = (q.head + 1) % len(q.buf)
	q.size--
}
