package mockworker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-router/switchyard/router/sim"
)

// engine drives one sim.Worker in real time from a single goroutine (run);
// handlers talk to it through channels and read their request's progress
// from its active record.
type engine struct {
	rank    int // data-parallel rank
	w       *sim.Worker
	m       *rankMetrics
	epoch   time.Time
	speedup float64
	total   int // KV blocks
	// kv publishes the cache's events; nil when KV events are off.
	kv *kvPublisher

	submits chan submitCmd
	aborts  chan int
	clears  chan chan bool
	lists   chan chan blockList
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once

	// Load for the data-parallel balancer, written by run: requests
	// waiting and running after the last change. pending counts requests
	// the balancer sent here that are not yet submitted (vLLM's balancer
	// counts its own picks the same way between load updates).
	waiting, running, pending atomic.Int64

	// Owned by run.
	reqs        map[int]*active
	nextID      int
	now         time.Duration // latest simulated time used
	evs         []sim.Event
	preemptions int64
	// queried and hit are the prompt tokens looked up in the prefix cache
	// and found there (SGLang's cache_hit_rate).
	queried, hit int64
}

type submitCmd struct {
	a     *active
	r     sim.Request
	reply chan error
}

// active is one request in the engine. The fields under mu are written by
// the engine goroutine and read by the request's handler, which is woken
// through notify.
type active struct {
	id     int
	prompt int
	output int
	// ids are the prompt's token ids when it was tokenized or given as
	// ids (BlockStored events carry them); nil for text hashed by bytes.
	ids []int64
	// lora is the LoRA adapter's name ("" for the base model) and loraID
	// its vLLM adapter id; salt the request's cache_salt. BlockStored
	// events carry them.
	lora   string
	loraID int64
	salt   string
	// transferred: the prompt's KV came from a prefill worker, which
	// sampled the first token (sim.Request.KVTransferred).
	transferred bool
	notify      chan struct{} // capacity 1: "there is news"

	mu       sync.Mutex
	submitAt time.Duration   // simulated submission time
	times    []time.Duration // simulated time of each token produced so far
	cached   int             // prompt tokens from the prefix cache (set with the first token)
	done     bool            // all output tokens produced

	// Owned by the engine goroutine.
	decoding bool // first token produced, not completed
	emitted  int  // tokens handed out
}

// progress is a snapshot of an active request for its handler.
type progress struct {
	submitAt time.Duration
	times    []time.Duration // tokens from the requested offset on
	cached   int
	done     bool
}

// since returns the request's progress with the tokens from index from on.
// The returned slice aliases the engine's; its elements never change.
func (a *active) since(from int) progress {
	a.mu.Lock()
	defer a.mu.Unlock()
	return progress{submitAt: a.submitAt, times: a.times[from:len(a.times):len(a.times)], cached: a.cached, done: a.done}
}

// produce records n tokens at simulated time at and wakes the handler.
func (a *active) produce(at time.Duration, n int, first bool, cached int, done bool) {
	a.mu.Lock()
	for range n {
		a.times = append(a.times, at)
	}
	if first {
		a.cached = cached
	}
	a.done = a.done || done
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// startEngine runs w as data-parallel rank rank from epoch on; kv, when
// not nil, publishes its KV events.
func startEngine(rank int, w *sim.Worker, epoch time.Time, speedup float64, m *rankMetrics, kv *kvPublisher) *engine {
	e := &engine{
		rank: rank, w: w, m: m, epoch: epoch, speedup: speedup, kv: kv,
		total:   w.Config().TotalKVBlocks,
		submits: make(chan submitCmd),
		aborts:  make(chan int, 256),
		clears:  make(chan chan bool),
		lists:   make(chan chan blockList),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		reqs:    make(map[int]*active),
	}
	if kv != nil {
		w.SetKVEventHook(e.kvEvent)
	}
	e.updateLoad()
	go e.run()
	return e
}

func (e *engine) close() {
	e.once.Do(func() { close(e.quit) })
	<-e.done
}

// submit hands r to the engine; on success a.id is set and the engine
// reports progress in a.
func (e *engine) submit(a *active, r sim.Request) error {
	reply := make(chan error, 1)
	select {
	case e.submits <- submitCmd{a: a, r: r, reply: reply}:
	case <-e.done:
		return errClosed
	}
	select {
	case err := <-reply:
		return err
	case <-e.done:
		return errClosed
	}
}

// abort asks the engine to drop request id (a no-op if it completed).
func (e *engine) abort(id int) {
	select {
	case e.aborts <- id:
	case <-e.done:
	}
}

// clearCache asks the engine to drop its prefix cache
// (sim.Worker.ClearPrefixCache); false if it refused (requests running)
// or stopped.
func (e *engine) clearCache() bool {
	reply := make(chan bool, 1)
	select {
	case e.clears <- reply:
	case <-e.done:
		return false
	}
	select {
	case ok := <-reply:
		return ok
	case <-e.done:
		return false
	}
}

// simNow is the simulated time now, for handlers (clock is the engine
// goroutine's).
func (e *engine) simNow() time.Duration {
	return time.Duration(float64(time.Since(e.epoch)) * e.speedup)
}

// clock returns the simulated time now, never less than a time used before.
func (e *engine) clock() time.Duration {
	t := time.Duration(float64(time.Since(e.epoch)) * e.speedup)
	e.now = max(e.now, t)
	return e.now
}

// wallUntil returns the wall time left until simulated time t.
func (e *engine) wallUntil(t time.Duration) time.Duration {
	return time.Duration(float64(t)/e.speedup) - time.Since(e.epoch)
}

func (e *engine) run() {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.catchUp()
		var tick <-chan time.Time
		next, busy := e.w.NextEvent() // may form a step, evicting blocks
		e.flushKV()
		if busy {
			timer.Reset(max(0, e.wallUntil(next)))
			tick = timer.C
		} else {
			timer.Stop()
		}
		select {
		case <-e.quit:
			return
		case c := <-e.submits:
			e.catchUp()
			e.doSubmit(c)
		case id := <-e.aborts:
			e.catchUp()
			e.doAbort(id)
		case reply := <-e.clears:
			e.catchUp()
			ok := e.w.ClearPrefixCache()
			e.flushKV()
			reply <- ok
		case reply := <-e.lists:
			e.catchUp()
			reply <- e.listBlocks()
		case <-tick:
		}
	}
}

// catchUp runs, one at a time, every step that ends by the simulated time
// now, handing out each step's tokens at its end.
func (e *engine) catchUp() {
	now := e.clock()
	for {
		next, busy := e.w.NextEvent()
		if !busy || next > now {
			break
		}
		// next is the end of the step in flight: Advance runs exactly it
		// (the following step, starting at next, is left unformed).
		e.evs = e.w.Advance(next, e.evs[:0])
		e.flushKV()
		// The gauges change before the step's tokens go out, so a client
		// that has read its last token never scrapes itself as running.
		e.updateLoad()
		e.stepEnded(next, e.evs)
	}
	e.updateLoad()
}

func (e *engine) doSubmit(c submitCmd) {
	e.nextID++
	id := e.nextID
	c.r.ID = id
	now := e.now
	err := e.w.Submit(now, &c.r)
	e.flushKV()
	if err != nil {
		c.reply <- err
		return
	}
	c.a.id = id
	c.a.mu.Lock()
	c.a.submitAt = now
	c.a.mu.Unlock()
	e.reqs[id] = c.a
	e.updateLoad()
	c.reply <- nil
}

func (e *engine) doAbort(id int) {
	if _, ok := e.reqs[id]; !ok {
		return // completed
	}
	delete(e.reqs, id)
	e.w.Abort(id)
	e.updateLoad()
}

// stepEnded hands out the tokens of the step that ended at at with events
// evs: one to every request that was decoding before the step (never its
// last, which comes with Completed), the first to requests whose prefill
// ended, the rest to completed ones.
func (e *engine) stepEnded(at time.Duration, evs []sim.Event) {
	// Counters move before the tokens they count go out, so a client that
	// has read its tokens scrapes them counted.
	for _, a := range e.reqs {
		if a.decoding && a.emitted < a.output-1 {
			a.emitted++
			e.m.generationTokens.Inc()
			a.produce(at, 1, false, 0, false)
		}
	}
	for _, ev := range evs {
		a := e.reqs[ev.RequestID]
		if a == nil {
			continue
		}
		switch ev.Kind {
		case sim.FirstToken:
			if a.transferred {
				// The end of the first decode step here: the token the
				// prefill worker sampled and this step's go out together.
				// No prompt was computed and the cache was not queried.
				a.decoding, a.emitted = true, 2
				e.m.generationTokens.Inc()
				a.produce(at, 2, true, 0, a.output == 2)
				continue
			}
			a.decoding, a.emitted = true, 1
			e.m.generationTokens.Inc()
			e.m.promptTokens.Add(float64(a.prompt))
			e.m.cacheQueries.Add(float64(a.prompt))
			e.m.cacheHits.Add(float64(ev.CachedTokens))
			if e.m.hitRate != nil {
				e.queried += int64(a.prompt)
				e.hit += int64(ev.CachedTokens)
				e.m.hitRate.Set(float64(e.hit) / float64(e.queried))
			}
			a.produce(at, 1, true, ev.CachedTokens, a.output == 1)
		case sim.Completed:
			n := a.output - a.emitted
			a.decoding, a.emitted = false, a.output
			e.m.generationTokens.Add(float64(n))
			delete(e.reqs, ev.RequestID)
			e.m.success.Inc()
			a.produce(at, n, false, 0, true)
		}
	}
}

func (e *engine) updateLoad() {
	l := e.w.Load()
	e.running.Store(int64(l.Running))
	e.waiting.Store(int64(l.Waiting))
	e.m.running.Set(float64(l.Running))
	e.m.waiting.Set(float64(l.Waiting))
	e.m.kvUsage.Set(float64(l.UsedBlocks) / float64(e.total))
	if e.m.usedTokens != nil {
		e.m.usedTokens.Set(float64(l.UsedBlocks * e.w.Config().BlockSize))
	}
	if p := e.w.Stats().Preemptions; p > e.preemptions {
		e.m.preemptions.Add(float64(p - e.preemptions))
		e.preemptions = p
	}
}
