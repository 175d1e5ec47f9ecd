package admission

import (
	"fmt"
	"hash/maphash"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/shared"
)

// liveShards is the live table's shard count: concurrent admissions lock
// one shard each, briefly, so they rarely meet.
const liveShards = 64

// liveTable maps the ids of the live requests to their handles: for
// classifiers' Progress and to refuse a second live request under one id.
type liveTable struct {
	seed   maphash.Seed
	shards [liveShards]struct {
		mu sync.Mutex
		m  map[string]*Handle
		_  [40]byte // keep shards on their own cache lines
	}
}

func (t *liveTable) init() {
	t.seed = maphash.MakeSeed()
	for i := range t.shards {
		t.shards[i].m = map[string]*Handle{}
	}
}

func (t *liveTable) shard(id string) int {
	return int(maphash.String(t.seed, id) % liveShards)
}

// add records h under id; false when id is live already.
func (t *liveTable) add(id string, h *Handle) bool {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.m[id]; dup {
		return false
	}
	s.m[id] = h
	return true
}

// remove forgets id when it is h's.
func (t *liveTable) remove(id string, h *Handle) {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	if s.m[id] == h {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

func (t *liveTable) get(id string) *Handle {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// partKey names a classifier partition.
type partKey struct {
	model string
	role  shared.Role
}

// classifierSet is one classifier factory with the per-partition
// classifiers it made. Reads are lock-free: the map is replaced, never
// modified, when a partition's classifier is first made.
type classifierSet struct {
	factory shared.ClassifierFactory
	// own is true for Options.Classifier's set: the Controller's own
	// factory never changes, whether or not its type is comparable.
	own       bool
	parts     atomic.Pointer[map[partKey]*partClassifier]
	listeners atomic.Pointer[[]shared.EventListener]
	mu        sync.Mutex // serialises replacing parts and listeners
}

// partClassifier is one partition's classifier, made once.
type partClassifier struct {
	once sync.Once
	c    shared.Classifier
	err  error
}

// classifierFor returns the classifier of the (model, role) partition
// from the current factory (the bundle's request_classifier, else
// Options.Classifier), made on first use; nil without a factory. A reload
// that brings a new factory starts a new set: the old factory is closed
// with its bundle, so its classifiers are not called again. In process
// and out of process alike, a factory makes one classifier per partition,
// with PartitionContext.Model set. A (model, role) without a partition
// yet gets one only while it has workers; otherwise the error wraps
// shared.ErrNoWorkers.
func (c *Controller) classifierFor(model string, role shared.Role) (shared.Classifier, error) {
	f, own := c.core.ClassifierFactory(), false
	if f == nil {
		f, own = c.factory, true
	}
	if f == nil {
		return nil, nil
	}
	cs := c.cls.Load()
	if !cs.serves(f, own) {
		cs = c.newSet(f, own)
	}
	key := partKey{model, role}
	pc := (*cs.parts.Load())[key]
	if pc == nil {
		// Model names come from clients: a partition is made only for
		// a model and role that have workers, so names nobody serves
		// (which the core would refuse anyway) cannot grow the set.
		if len(c.core.Workers(model, role)) == 0 {
			return nil, fmt.Errorf("model %q, role %s: %w", model, role, shared.ErrNoWorkers)
		}
		pc = cs.part(key)
	}
	pc.once.Do(func() {
		var sessions shared.SessionStore
		if c.sessions != nil {
			sessions = c.sessions(model, role)
		}
		pc.c, pc.err = f.NewClassifier(shared.PartitionContext{
			Model:     model,
			Role:      role,
			BlockSize: c.core.BlockSize(),
			Workers:   func() []shared.WorkerInfo { return c.core.PartitionInfos(model, role) },
			Progress:  c.Progress,
			Now:       c.now,
			Sessions:  sessions,
		})
		if l, ok := pc.c.(shared.EventListener); ok && pc.err == nil && !sameComponent(pc.c, f) {
			cs.addListener(l)
		}
	})
	return pc.c, pc.err
}

// serves reports whether cs is the set of f (own: Options.Classifier).
func (cs *classifierSet) serves(f shared.ClassifierFactory, own bool) bool {
	return cs != nil && cs.own == own && (own || sameComponent(cs.factory, f))
}

// newSet makes f the current factory's set, unless another caller did.
func (c *Controller) newSet(f shared.ClassifierFactory, own bool) *classifierSet {
	c.clsMu.Lock()
	defer c.clsMu.Unlock()
	if cs := c.cls.Load(); cs.serves(f, own) {
		return cs
	}
	cs := &classifierSet{factory: f, own: own}
	parts := map[partKey]*partClassifier{}
	cs.parts.Store(&parts)
	var ls []shared.EventListener
	if l, ok := f.(shared.EventListener); ok {
		ls = append(ls, l)
	}
	cs.listeners.Store(&ls)
	c.cls.Store(cs)
	return cs
}

// part returns key's entry, adding it (copy on write) when missing.
func (cs *classifierSet) part(key partKey) *partClassifier {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := *cs.parts.Load()
	if pc := old[key]; pc != nil {
		return pc
	}
	parts := make(map[partKey]*partClassifier, len(old)+1)
	for k, v := range old {
		parts[k] = v
	}
	pc := &partClassifier{}
	parts[key] = pc
	cs.parts.Store(&parts)
	return pc
}

func (cs *classifierSet) addListener(l shared.EventListener) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	ls := append(append([]shared.EventListener(nil), *cs.listeners.Load()...), l)
	cs.listeners.Store(&ls)
}

// sameComponent compares two components by identity, false for types
// that cannot be compared.
func sameComponent(a, b any) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}
