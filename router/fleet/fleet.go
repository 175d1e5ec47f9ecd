// Package fleet holds the router's view of its workers: membership by role,
// each worker's router-owned booking counts (ACTIVE_REQUESTS and the booked
// part of LOAD), and the engine's last load report.
//
// Membership changes publish an immutable Snapshot through an atomic
// pointer, so selection reads candidates with no lock. Booking is keyed by
// the worker's join generation: a booking holds the *Worker it was made on,
// and a worker that leaves and rejoins under the same id is a new *Worker,
// so a late release can never drive the new counts negative.
package fleet

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/router/predict"
	"github.com/switchyard-router/switchyard/shared"
)

// ErrUnknownWorker: RemoveWorker of an id that is not a member.
var ErrUnknownWorker = errors.New("unknown worker")

// Spec describes a worker joining the fleet.
type Spec struct {
	ID     shared.WorkerID
	DPRank uint32
	Role   shared.Role
	// TotalKVBlocks is the worker's KV capacity in router blocks
	// (block_size tokens), the CAPACITY input; >= 0, where 0 means unknown
	// (CAPACITY unavailable for the worker, which stays routable).
	TotalKVBlocks int64
	// Name is the worker's name (a worker block's or pod's name, or
	// "sim-3" in router replay); ID is shared.WorkerIDOf(Name) for every
	// worker the router's faces add. Plugins that declare LABELS see it
	// (shared.Candidates.Names).
	Name string
	// Labels are the worker's own labels (its worker block's `labels`,
	// or its pod's labels); nil when it has none. The fleet adds the
	// router-set keys (shared.WorkerLabels) when the worker joins: plugins
	// that declare LABELS see the result (shared.Candidates.Labels).
	Labels map[string]string
	// Models are the model names the worker serves; requests naming a
	// model are routed among the workers that list it (Snapshot
	// ModelPartition). Empty for simulated workers.
	Models []string
	// EngineBlockSize is the engine's own KV block size in tokens, as its
	// metrics report it (vLLM cache_config_info block_size, SGLang
	// page_size); 0 when unknown or simulated. Precise prefix keys are
	// cut at this size.
	EngineBlockSize int64
	// DataParallel is true when the worker's engine reports data-parallel
	// ranks (several members share its URL, one per DPRank): requests to
	// it name DPRank (router serve sends the X-data-parallel-rank header).
	DataParallel bool
	// Slot is the worker's slot in the router's prefix index
	// (prefix.Index.Slot), by which the index scores it through the
	// Partition's Slots column; Router.AddWorkers sets it, whatever the
	// caller gave. -1: not tracked (overlap 0).
	Slot int32
	// Predictor is the latency predictor's model of the worker's class
	// (predict.Set.Class); Router.AddWorkers sets it, whatever the caller
	// gave. nil: the pooled model.
	Predictor *predict.Model
	// KVTokens is TotalKVBlocks in tokens (the blocks' own size:
	// Router.CapacityBlockSize); 0 when unknown. Router.AddWorkers sets
	// it.
	KVTokens int64
}

// Validate reports a spec the fleet refuses: an invalid role or a
// negative capacity.
func (s Spec) Validate() error {
	if !s.Role.Valid() {
		return fmt.Errorf("worker %d: invalid role %q", s.ID, s.Role)
	}
	if s.TotalKVBlocks < 0 {
		return fmt.Errorf("worker %d: total_kv_blocks %d, want >= 0 (0: unknown)", s.ID, s.TotalKVBlocks)
	}
	return nil
}

// Worker is one member of the fleet for one join generation.
type Worker struct {
	// The counters a selection reads of every candidate (FillLoads) come
	// first, within 32 bytes, so that reading them touches one cache line
	// of the worker, not two, most of the time.
	active        atomic.Int64
	prefillTokens atomic.Int64
	decodeBlocks  atomic.Int64
	engine        atomic.Pointer[EngineLoad]

	Spec
	// Generation increases with every join across the fleet.
	Generation uint64
	// AllLabels are Spec.Labels with the router-set keys
	// (shared.WorkerLabels of its role, models and rank), built once when
	// the worker joins; immutable.
	AllLabels shared.Labels

	full *atomic.Int64 // the fleet's count of workers at capacity
	// left is closed when this generation leaves the fleet (Left).
	left chan struct{}
}

// Left returns a channel closed when this join generation of the worker
// leaves the fleet: RemoveWorker, or a join of the same id and rank that
// replaces it. Requests in flight on it keep their bookings; a face may
// let them finish for a grace period and then move them (serve's
// migration). nil for a Worker the fleet did not make.
func (w *Worker) Left() <-chan struct{} { return w.left }

// EngineLoad is what the engine last reported of itself.
type EngineLoad struct {
	KVUsage    float64 // 0..1
	HasKVUsage bool
	Waiting    int64
	HasWaiting bool
}

// ActiveRequests is the in-flight count booked on this worker.
func (w *Worker) ActiveRequests() int64 { return w.active.Load() }

// SetEngineLoad records the engine's own report; nil clears it (no
// observation: Load.Available becomes false).
func (w *Worker) SetEngineLoad(l *EngineLoad) { w.engine.Store(l) }

// Load returns the LOAD input for this worker. Available is true when the
// engine has reported, or when the worker is simulated and the router's own
// bookings are the whole truth (see Fleet.BookingsAreLoad).
func (w *Worker) Load(bookingsAreLoad bool) shared.Load {
	var l shared.Load
	w.LoadInto(&l, bookingsAreLoad)
	return l
}

// LoadInto writes Load(bookingsAreLoad) into *l: FillLoads for one
// worker.
func (w *Worker) LoadInto(l *shared.Load, bookingsAreLoad bool) {
	var one [1]shared.Load
	FillLoads([]*Worker{w}, one[:], bookingsAreLoad)
	*l = one[0]
}

// FillLoads writes workers[i].Load(bookingsAreLoad) into loads[i] for
// every i (len(loads) >= len(workers)): the LOAD column of a selection, in
// one loop with the reads inlined, no call per worker (a selection over
// 4,096 workers spends most of this on the first read of each worker's
// counters, one cache line per worker).
func FillLoads(workers []*Worker, loads []shared.Load, bookingsAreLoad bool) {
	loads = loads[:len(workers)]
	for i, w := range workers {
		l := &loads[i]
		l.ActivePrefillTokens = w.prefillTokens.Load()
		l.ActiveDecodeBlocks = w.decodeBlocks.Load()
		l.ActiveRequests = w.active.Load()
		if e := w.engine.Load(); e != nil {
			l.Available = true
			l.KVUsage, l.HasKVUsage = e.KVUsage, e.HasKVUsage
			l.Waiting, l.HasWaiting = e.Waiting, e.HasWaiting
			continue
		}
		l.Available = bookingsAreLoad
		l.KVUsage, l.HasKVUsage, l.Waiting, l.HasWaiting = 0, false, 0, false
	}
}

// Partition is the sorted members of one role (and, when Model is set, of
// one model) in one snapshot. It is immutable once published.
type Partition struct {
	Role    shared.Role
	Model   string            // "" for the partition of every model
	Workers []*Worker         // ascending (ID, DPRank)
	IDs     []shared.WorkerID // IDs[i] == Workers[i].ID
	DPRanks []uint32          // nil when every rank is 0
	Slots   []int32           // Slots[i] == Workers[i].Slot
	// KVBlocks[i] == Workers[i].TotalKVBlocks: the CAPACITY column,
	// copied as it is into a selection's candidates.
	KVBlocks []int64
	// Names[i] == Workers[i].Name and Labels[i] == Workers[i].AllLabels:
	// the LABELS columns, copied as they are (string and slice headers)
	// into the candidates of a selection whose policy declares LABELS.
	// nil in a partition narrowed by the router (the selection then reads
	// each worker's own).
	Names  []string
	Labels []shared.Labels
	// Predictors[i] == Workers[i].Predictor and KVTokens[i] ==
	// Workers[i].KVTokens: what a selection that declares LATENCY reads
	// of every candidate, as columns so that it does not touch each
	// worker's spec. nil in a narrowed partition, like Names.
	Predictors []*predict.Model
	KVTokens   []int64
	// Key identifies the candidate set (role and member generations), so a
	// round-robin cursor is never shared by two sets.
	Key uint64
	// ActiveAt returns Workers[row].ActiveRequests(); built once per
	// partition so the hosted path passes it without allocating.
	ActiveAt func(row int) int64
	// Infos describes the members for classifiers (shared.PartitionContext
	// Workers), in the same order; immutable.
	Infos []shared.WorkerInfo
}

// Snapshot is one immutable membership view.
type Snapshot struct {
	roles      map[shared.Role]*Partition
	models     map[modelRole]*Partition
	modelNames []string
}

type modelRole struct {
	model string
	role  shared.Role
}

// Partition returns the members of role, whatever models they serve; nil
// when there are none.
func (s *Snapshot) Partition(role shared.Role) *Partition { return s.roles[role] }

// ModelPartition returns the members of role that serve model; with model
// "" it is Partition(role). nil when there are none.
func (s *Snapshot) ModelPartition(model string, role shared.Role) *Partition {
	if model == "" {
		return s.roles[role]
	}
	return s.models[modelRole{model, role}]
}

// Models returns the sorted union of the members' models.
func (s *Snapshot) Models() []string { return s.modelNames }

// Fleet is the set of workers. Membership changes take a lock and publish a
// new Snapshot; reads are lock-free.
type Fleet struct {
	mu      sync.Mutex
	gen     uint64
	members map[key]*Worker
	snap    atomic.Pointer[Snapshot]
	// full counts the workers that a TryBook took to its capacity and
	// that have not dropped below it since (AtCapacity).
	full fullCount
}

// fullCount is an atomic count on a cache line of its own: read by every
// selection under a capacity, written only when a worker fills up or
// frees its last slot.
type fullCount struct {
	_ [64]byte
	n atomic.Int64
	_ [56]byte
}

// AtCapacity reports whether some worker may be at the capacity a
// TryBook enforced: false means every worker booked with TryBook is below
// it, so a selection under that capacity need not check each candidate
// (the try-book still guards the limit). Bookings made with Book, or
// with different capacities on one fleet, can make it report true when
// no worker is full (a check that finds nothing: correct, only slower),
// never false while TryBook would refuse a worker for long.
func (f *Fleet) AtCapacity() bool { return f.full.n.Load() > 0 }

type key struct {
	id   shared.WorkerID
	rank uint32
}

// New returns an empty fleet.
func New() *Fleet {
	f := &Fleet{members: make(map[key]*Worker)}
	f.snap.Store(&Snapshot{roles: map[shared.Role]*Partition{}, models: map[modelRole]*Partition{}})
	return f
}

// Snapshot returns the current membership.
func (f *Fleet) Snapshot() *Snapshot { return f.snap.Load() }

// AddWorker joins a worker under a new generation and returns it. Joining an
// id (and rank) that is already a member replaces it: the old *Worker keeps
// its bookings, which release against it, not the new one.
func (f *Fleet) AddWorker(s Spec) (*Worker, error) {
	ws, err := f.AddWorkers(s)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// AddWorkers joins several workers at once and publishes one snapshot, so
// building a fleet of n costs O(n log n), not n snapshots. It checks every
// spec first and joins none when one is invalid.
func (f *Fleet) AddWorkers(specs ...Spec) ([]*Worker, error) {
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The workers joining together are one array: a selection reads
	// their counters in order, which then streams through memory instead
	// of visiting scattered objects. (A worker still referenced keeps its
	// batch's memory: 144 bytes a worker.)
	batch := make([]Worker, len(specs))
	out := make([]*Worker, len(specs))
	for i, s := range specs {
		f.gen++
		w := &batch[i]
		w.Spec, w.Generation, w.full, w.left = s, f.gen, &f.full.n, make(chan struct{})
		w.AllLabels = shared.WorkerLabels(s.Labels, s.Role, s.Models, s.DataParallel || s.DPRank != 0, s.DPRank)
		out[i] = w
		if old, ok := f.members[key{s.ID, s.DPRank}]; ok && old.left != nil {
			close(old.left)
		}
		f.members[key{s.ID, s.DPRank}] = w
	}
	f.publishLocked()
	return out, nil
}

// RemoveWorker takes a worker out of every future candidate set. Requests
// in flight on it keep their bookings until they end.
func (f *Fleet) RemoveWorker(id shared.WorkerID, rank uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key{id, rank}
	w, ok := f.members[k]
	if !ok {
		return fmt.Errorf("removing worker %d rank %d: %w", id, rank, ErrUnknownWorker)
	}
	delete(f.members, k)
	if w.left != nil {
		close(w.left)
	}
	f.publishLocked()
	return nil
}

func (f *Fleet) publishLocked() {
	groups := map[modelRole][]*Worker{}
	for _, w := range f.members {
		groups[modelRole{"", w.Role}] = append(groups[modelRole{"", w.Role}], w)
		for _, m := range w.Models {
			if m != "" {
				groups[modelRole{m, w.Role}] = append(groups[modelRole{m, w.Role}], w)
			}
		}
	}
	snap := &Snapshot{roles: map[shared.Role]*Partition{}, models: map[modelRole]*Partition{}}
	for k, ws := range groups {
		p := newPartition(k.model, k.role, ws)
		if k.model == "" {
			snap.roles[k.role] = p
		} else {
			snap.models[k] = p
			snap.modelNames = append(snap.modelNames, k.model)
		}
	}
	slices.Sort(snap.modelNames)
	snap.modelNames = slices.Compact(snap.modelNames)
	f.snap.Store(snap)
}

// newPartition sorts ws and builds the partition of model (or of every
// model when "") and role.
func newPartition(model string, role shared.Role, ws []*Worker) *Partition {
	slices.SortFunc(ws, func(a, b *Worker) int {
		if a.ID != b.ID {
			if a.ID < b.ID {
				return -1
			}
			return 1
		}
		return int(a.DPRank) - int(b.DPRank)
	})
	p := &Partition{Role: role, Model: model, Workers: ws, IDs: make([]shared.WorkerID, len(ws)), Slots: make([]int32, len(ws)), KVBlocks: make([]int64, len(ws)), Infos: make([]shared.WorkerInfo, len(ws)),
		Names: make([]string, len(ws)), Labels: make([]shared.Labels, len(ws)),
		Predictors: make([]*predict.Model, len(ws)), KVTokens: make([]int64, len(ws))}
	h := fnv(fnv(0xcbf29ce484222325, []byte(role)), []byte(model))
	for i, w := range ws {
		p.IDs[i], p.Slots[i], p.KVBlocks[i] = w.ID, w.Slot, w.TotalKVBlocks
		p.Names[i], p.Labels[i] = w.Name, w.AllLabels
		p.Predictors[i], p.KVTokens[i] = w.Predictor, w.KVTokens
		p.Infos[i] = shared.WorkerInfo{ID: w.ID, DPRank: w.DPRank, TotalKVBlocks: w.TotalKVBlocks}
		if w.DPRank != 0 && p.DPRanks == nil {
			p.DPRanks = make([]uint32, len(ws))
		}
		h = fnv64(h, uint64(w.ID))
		h = fnv64(h, uint64(w.DPRank)<<32|w.Generation&0xffffffff)
	}
	if p.DPRanks != nil {
		for i, w := range ws {
			p.DPRanks[i] = w.DPRank
		}
	}
	if h == 0 {
		h = 1 // zero means "unknown" to the hosted path
	}
	p.Key = h
	p.ActiveAt = func(row int) int64 { return ws[row].active.Load() }
	return p
}

func fnv(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= 0x100000001b3
	}
	return h
}

func fnv64(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= 0x100000001b3
		v >>= 8
	}
	return h
}
