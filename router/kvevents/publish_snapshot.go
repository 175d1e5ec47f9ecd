package kvevents

import (
	"errors"
	"fmt"
	"slices"
)

// snapshotState is the Publisher's snapshot recorder: the live residency
// of the published stream and the stored events needed to rebuild it,
// following vLLM's KVCacheSnapshot (vMaroon/vllm@08ee3e54
// vllm/distributed/kv_events_snapshot.py) field for field. A store event
// is a source; a source is kept while a resident block's latest store is
// it, or another kept source depends on it (the parent's store, and for
// a tokenless store the stores that gave its blocks' token ids).
// Collection runs after each applied batch, so metadata moved from GPU
// to CPU within one batch survives. Not safe for concurrent use (the
// Publisher holds its lock).
type snapshotState struct {
	live    map[blockKey]liveRef
	sources map[int64]*snapSource
	// known are, per hash, the sources whose store carried its tokens, in
	// ascending id order (the last is the one a dependency takes).
	known    map[uint64][]int64
	unused   []int64
	nextID   int64
	metaSize int
	refs     int
	maxRefs  int
	maxMeta  int
}

// blockKey is a residency key: (medium, group_idx, hash). vLLM's key also
// has locality and ownership, which Event does not carry (they are None
// for every event the mock publishes).
type blockKey struct {
	medium    string
	hasMedium bool
	group     int64
	hasGroup  bool
	hash      uint64
}

type liveRef struct {
	count  int
	source int64 // the latest store of the key
}

type snapSource struct {
	ev   Event // a deep copy
	deps []int64
	cost int
	refs int
}

var errSnapshotBudget = errors.New("snapshot budget exceeded")

// newSnapshotState returns an empty state bounded by maxRefs references
// and maxMeta estimated metadata bytes (0: unbounded).
func newSnapshotState(maxRefs, maxMeta int) *snapshotState {
	return &snapshotState{live: map[blockKey]liveRef{}, sources: map[int64]*snapSource{},
		known: map[uint64][]int64{}, maxRefs: maxRefs, maxMeta: maxMeta}
}

func keyOf(ev *Event, h uint64) blockKey {
	return blockKey{medium: string(ev.Medium), hasMedium: ev.Medium != nil, group: ev.GroupIdx, hasGroup: ev.HasGroupIdx, hash: h}
}

// gpu: medium "GPU" or none, the tier AllBlocksCleared clears.
func (k blockKey) gpu() bool { return !k.hasMedium || k.medium == MediumGPU }

// apply folds one batch's events. An error (a store whose parent or, for
// a tokenless store, whose blocks' metadata was never seen; a bound
// passed) leaves the state unusable: the caller drops it.
func (s *snapshotState) apply(events []Event) error {
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case BlockStored:
			if err := s.store(ev); err != nil {
				return err
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				k := keyOf(ev, h)
				r, ok := s.live[k]
				if !ok {
					continue
				}
				s.refs--
				if r.count > 1 {
					s.live[k] = liveRef{r.count - 1, r.source}
				} else {
					delete(s.live, k)
					s.release(r.source)
				}
			}
		case AllBlocksCleared:
			for k, r := range s.live {
				if k.gpu() {
					delete(s.live, k)
					s.refs -= r.count
					s.release(r.source)
				}
			}
		default:
			return fmt.Errorf("unsupported KV event kind %v", ev.Kind)
		}
	}
	s.collect()
	return nil
}

func (s *snapshotState) dependency(h uint64) (int64, error) {
	ids := s.known[h]
	if len(ids) == 0 {
		return 0, fmt.Errorf("missing reconstruction metadata for block %d", h)
	}
	return ids[len(ids)-1], nil
}

func (s *snapshotState) store(ev *Event) error {
	if len(ev.BlockHashes) == 0 {
		return nil
	}
	var deps []int64
	if ev.HasParent {
		d, err := s.dependency(ev.ParentBlockHash)
		if err != nil {
			return err
		}
		deps = append(deps, d)
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			d, err := s.dependency(h)
			if err != nil {
				return err
			}
			if !slices.Contains(deps, d) {
				deps = append(deps, d)
			}
		}
	}
	cost := 512 + 64*(len(ev.BlockHashes)+len(ev.TokenIDs)) + eventSize(ev)
	if s.maxMeta > 0 && s.metaSize+cost > s.maxMeta {
		return fmt.Errorf("%w: metadata", errSnapshotBudget)
	}
	if s.maxRefs > 0 && s.refs+len(ev.BlockHashes) > s.maxRefs {
		return fmt.Errorf("%w: references", errSnapshotBudget)
	}
	id := s.nextID
	s.nextID++
	src := &snapSource{ev: cloneEvent(ev), deps: deps, cost: cost}
	s.sources[id] = src
	s.metaSize += cost
	for _, d := range deps {
		s.sources[d].refs++
	}
	if len(ev.TokenIDs) > 0 {
		for _, h := range ev.BlockHashes {
			if ids := s.known[h]; len(ids) == 0 || ids[len(ids)-1] != id {
				s.known[h] = append(ids, id)
			}
		}
	}
	for _, h := range ev.BlockHashes {
		k := keyOf(ev, h)
		count := 0
		if r, ok := s.live[k]; ok {
			count = r.count
			s.release(r.source)
		}
		s.live[k] = liveRef{count + 1, id}
		src.refs++
		s.refs++
	}
	return nil
}

func (s *snapshotState) release(id int64) {
	src := s.sources[id]
	src.refs--
	if src.refs == 0 {
		s.unused = append(s.unused, id)
	}
}

// collect drops the sources nothing refers to any more, and then what
// only they referred to.
func (s *snapshotState) collect() {
	for len(s.unused) > 0 {
		id := s.unused[len(s.unused)-1]
		s.unused = s.unused[:len(s.unused)-1]
		src, ok := s.sources[id]
		if !ok || src.refs > 0 {
			continue
		}
		delete(s.sources, id)
		s.metaSize -= src.cost
		if len(src.ev.TokenIDs) > 0 {
			for _, h := range src.ev.BlockHashes {
				ids := s.known[h]
				if j := slices.Index(ids, id); j >= 0 {
					ids = slices.Delete(ids, j, j+1)
				}
				if len(ids) == 0 {
					delete(s.known, h)
				} else {
					s.known[h] = ids
				}
			}
		}
		for _, d := range src.deps {
			s.release(d)
		}
	}
}

// export is the snapshot as a replay program for an empty index: every
// kept store in its original order, stores repeated until each key
// reaches its live count, then BlockRemoved events of at most
// blocksPerEvent hashes taking away the excess (vLLM's
// KVCacheSnapshot.export). The events alias the state; encode them
// before the next apply.
func (s *snapshotState) export(blocksPerEvent int) []Event {
	ids := make([]int64, 0, len(s.sources))
	for id := range s.sources {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var out []Event
	emitted := make(map[blockKey]int, len(s.live))
	for _, id := range ids {
		ev := &s.sources[id].ev
		out = append(out, *ev)
		for _, h := range ev.BlockHashes {
			emitted[keyOf(ev, h)]++
		}
	}
	// Keys short of their count, in source order (deterministic).
	short := make([]blockKey, 0)
	for k, r := range s.live {
		if emitted[k] < r.count {
			short = append(short, k)
		}
	}
	slices.SortFunc(short, func(a, b blockKey) int {
		if c := cmpInt64(s.live[a].source, s.live[b].source); c != 0 {
			return c
		}
		return cmpUint64(a.hash, b.hash)
	})
	for _, k := range short {
		src := &s.sources[s.live[k].source].ev
		for emitted[k] < s.live[k].count {
			out = append(out, *src)
			for _, h := range src.BlockHashes {
				emitted[keyOf(src, h)]++
			}
		}
	}
	// Excess residency, removed per scope.
	type scope struct {
		medium    string
		hasMedium bool
		group     int64
		hasGroup  bool
	}
	var order []scope
	removals := map[scope][]uint64{}
	excess := make([]blockKey, 0)
	for k, n := range emitted {
		if n > s.live[k].count {
			excess = append(excess, k)
		}
	}
	slices.SortFunc(excess, func(a, b blockKey) int { return cmpUint64(a.hash, b.hash) })
	for _, k := range excess {
		sc := scope{k.medium, k.hasMedium, k.group, k.hasGroup}
		if _, ok := removals[sc]; !ok {
			order = append(order, sc)
		}
		for range emitted[k] - s.live[k].count {
			removals[sc] = append(removals[sc], k.hash)
		}
	}
	for _, sc := range order {
		hs := removals[sc]
		var medium []byte
		if sc.hasMedium {
			medium = []byte(sc.medium)
		}
		for len(hs) > 0 {
			n := min(len(hs), blocksPerEvent)
			out = append(out, Event{Kind: BlockRemoved, BlockHashes: hs[:n], Medium: medium, GroupIdx: sc.group, HasGroupIdx: sc.hasGroup})
			hs = hs[n:]
		}
	}
	return out
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cloneEvent copies ev and everything it points to.
func cloneEvent(ev *Event) Event {
	c := *ev
	c.BlockHashes = slices.Clone(ev.BlockHashes)
	c.raw = nil
	if ev.RawHashes != nil {
		c.RawHashes = make([]RawHash, len(ev.RawHashes))
		for i, r := range ev.RawHashes {
			c.RawHashes[i] = RawHash{Form: r.Form, Bytes: cloneBytes(r.Bytes)}
		}
	}
	c.TokenIDs = slices.Clone(ev.TokenIDs)
	c.Medium = cloneBytes(ev.Medium)
	c.LoRAName = cloneBytes(ev.LoRAName)
	c.SpecKind = cloneBytes(ev.SpecKind)
	c.extra = nil
	if ev.ExtraKeys != nil {
		c.ExtraKeys = make([][]byte, len(ev.ExtraKeys))
		for i, k := range ev.ExtraKeys {
			c.ExtraKeys[i] = cloneBytes(k)
		}
	}
	return c
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

// eventSize estimates ev's encoded size: 9 bytes per hash and token, the
// strings and extra keys as they are.
func eventSize(ev *Event) int {
	n := 16 + 9*(len(ev.BlockHashes)+len(ev.TokenIDs)) + len(ev.Medium) + len(ev.LoRAName) + len(ev.SpecKind)
	for _, k := range ev.ExtraKeys {
		n += 1 + len(k)
	}
	for _, r := range ev.RawHashes {
		n += len(r.Bytes)
	}
	return n
}
