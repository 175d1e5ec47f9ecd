package admission

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/queue"
	"github.com/switchyard-router/switchyard/shared"
)

// partQueue is the queue of one (model, role) partition and its lock.
type partQueue struct {
	key partKey
	mu  sync.Mutex
	q   *queue.Queue
}

// queueSet is the partitions' queues, each made when a request of its
// partition first waits. A request only waits after the core placed it as
// "all busy", so its partition has workers: the set grows with the
// fleet's (model, role) partitions, never with what clients send. Reads
// are lock-free: the list is replaced (copy on write) when a queue is
// added.
type queueSet struct {
	cfg queue.Config
	mu  sync.Mutex // serialises adding a queue
	// list holds every queue, ordered by role (config.Roles) then model:
	// the order Dispatch visits them in, the same on every run.
	list atomic.Pointer[[]*partQueue]
}

// init checks cfg by making a queue of it.
func (s *queueSet) init(cfg queue.Config) error {
	if _, err := queue.New(cfg); err != nil {
		return err
	}
	s.cfg = cfg
	s.list.Store(&[]*partQueue{})
	return nil
}

// all returns every queue in Dispatch's order; the slice is shared and
// must not be modified.
func (s *queueSet) all() []*partQueue { return *s.list.Load() }

// get returns key's queue, making it on first use.
func (s *queueSet) get(key partKey) *partQueue {
	if pq := find(s.all(), key); pq != nil {
		return pq
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.all()
	if pq := find(old, key); pq != nil {
		return pq
	}
	q, err := queue.New(s.cfg)
	if err != nil {
		panic("admission: a queue config that init accepted is refused: " + err.Error())
	}
	pq := &partQueue{key: key, q: q}
	list := append(slices.Clone(old), pq)
	slices.SortFunc(list, func(a, b *partQueue) int {
		if ra, rb := roleIndex(a.key.role), roleIndex(b.key.role); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.key.model, b.key.model)
	})
	s.list.Store(&list)
	return pq
}

func find(list []*partQueue, key partKey) *partQueue {
	for _, pq := range list {
		if pq.key == key {
			return pq
		}
	}
	return nil
}

// byRole returns the run of list (ordered by role) whose role is role.
func byRole(list []*partQueue, role shared.Role) []*partQueue {
	lo := slices.IndexFunc(list, func(pq *partQueue) bool { return pq.key.role == role })
	if lo < 0 {
		return nil
	}
	hi := lo
	for hi < len(list) && list[hi].key.role == role {
		hi++
	}
	return list[lo:hi]
}

func roleIndex(r shared.Role) int {
	if i := slices.Index(config.Roles, r); i >= 0 {
		return i
	}
	return len(config.Roles)
}
