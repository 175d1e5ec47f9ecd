package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// Warm start. One replica, the holder of the lease "snapshot" (lease.go;
// a replica competes for it once it has caught up, and when the holder
// dies another takes it once the lease expired), writes the Router's
// prefix index every SnapshotInterval to the object store <cluster>-index
// as the object "prefix-index", with the streams' positions it reflects. A
// replica that starts loads it, then replays the deltas stream from the
// sequence after it, and is caught up once it has applied the stream's
// last message as of its start (Replica.Ready).
//
// The snapshot's wire format, version 2 (integers little-endian):
//
//	snapshot = magic:"SYIX" version:byte deltas_seq:uvarint taken_at:uvarint
//	           writer:str workers:uvarint worker*
//	worker   = name:str rank:uvarint approx:uvarint hash:uint64*
//	           precise:byte [precise_body]
//	precise_body = kv_next:uvarint block_size:uvarint groups:uint64 cpu_groups:uint64
//	           flags:byte since_clear:uvarint
//	           blocks:uvarint (router:uint64 engine:uint64 mask:uint64)*
//	           has_cpu:byte [cpu_mask:uint64 * blocks]
//	           has_copies:byte [copies:uvarint * blocks]
//	           scopes:uvarint scope*  more:uvarint (block:uvarint scope:byte copies:uvarint)*
//	scope    = scope_flags:byte group:byte locality:uint64 ownership:uint64
//	flags    = bit 0 live, bit 1 warming; scope_flags = bit 0 CPU tier, bit 1 local
//
// Hash lists are most recent first (prefix.Content). kv_next is the KV
// stream sequence of the next message of the worker's subject the precise
// index had not applied (0: none applied): a replica that imports it
// follows the subject from there (Options.KVStartSeq). The precise body
// carries the index's residency as it counts it (prefix.PreciseContent):
// the CPU tier's groups and each block's groups with a CPU copy, each
// block's copies in its GPU tier's group 0 (vLLM's duplicate blocks), and,
// when those do not say it all (duplicates on the CPU tier or in another
// group, locality and ownership scopes), every scope's copies of every
// block. Version 1, written before, has the same layout without
// cpu_groups and without what follows the blocks (no CPU tier, one copy
// per group): it is still read; a replica that reads version 1 only
// refuses a version 2 snapshot (malformed) and starts from the streams.
// Decoding is linear in the snapshot's size and every count is checked
// against the bytes left before anything is allocated; a precise body
// prefix.Import would refuse (PreciseContent.WellFormed) makes the
// snapshot malformed.
const (
	snapshotMagic   = "SYIX"
	snapshotVersion = 2
	// snapshotVersion1 is the version before the CPU tier and the copies.
	snapshotVersion1 = 1
	// snapshotObject is the object's name in the store.
	snapshotObject = "prefix-index"
	// maxSnapshotBytes bounds a snapshot written and read: 64 MiB is 2.7M
	// precise blocks or 8M approximate block hashes. Past it each worker
	// keeps its most recent blocks within an equal share of the bytes
	// (cutWorker). The store holds at most two (a write replacing the
	// last), so NATS's max_memory_store must allow 128 MiB for it.
	maxSnapshotBytes   = 64 << 20
	maxSnapshotWorkers = 1 << 16
	// snapshotSlack is what the cut leaves for the header and the
	// workers' names and counts.
	snapshotSlack = 1 << 20
	// maxSnapshotCopies bounds a block's copies in one scope (the precise
	// index's own bound on a block's copies).
	maxSnapshotCopies = 1 << 30
)

// WorkerPrefix is one member's prefix index content, by worker name and
// data-parallel rank: what a replica's snapshot of the index carries,
// since worker ids differ from router to router.
type WorkerPrefix struct {
	Worker string
	Rank   uint32
	prefix.Content
}

// exportPrefix returns every member's prefix index content (of every role
// and model), by worker name and rank, in ascending (id, rank) order per
// role. Linear in what the index holds; routing goes on meanwhile, each
// member's lists locked only while they are copied (prefix.Index.Export).
func exportPrefix(r *router.Router) []WorkerPrefix {
	var out []WorkerPrefix
	for _, role := range []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode} {
		for _, w := range r.Workers("", role) {
			if c, ok := r.Prefix().Export(prefix.Candidate{ID: w.ID, Rank: w.DPRank}); ok {
				out = append(out, WorkerPrefix{Worker: w.Name, Rank: w.DPRank, Content: c})
			}
		}
	}
	return out
}

// errSnapshot: a snapshot that does not decode.
var errSnapshot = errors.New("malformed prefix-index snapshot")

// indexSnapshot is a decoded snapshot.
type indexSnapshot struct {
	// DeltasSeq is the last deltas stream sequence the index reflects.
	DeltasSeq uint64
	TakenAt   time.Time
	Writer    string
	Workers   []WorkerPrefix
	// KVNext is, per worker (same index), its precise index's kv_next.
	KVNext []uint64
}

// Upper bounds of a worker's encoding, for the cut: its fixed part (name,
// rank, counts, the precise body's header), a scope, a More entry.
const (
	workerFixedBytes = 2 + maxString + 3*binary.MaxVarintLen64 + 1 + 5*binary.MaxVarintLen64 + 8 + 8 + 1 + 2
	scopeBytes       = 2 + 8 + 8
	moreBytes        = binary.MaxVarintLen32 + 1 + binary.MaxVarintLen32
)

// workerCut is what of a worker's content a snapshot keeps: its approx
// most recent approximate hashes and, unless noPrecise, its precise most
// recent precise blocks (with their copies) and every scope.
type workerCut struct {
	approx, precise int
	noPrecise       bool
}

// bound returns an upper bound of w's encoding in bytes, uncut.
func bound(w *WorkerPrefix) int {
	n := workerFixedBytes + 8*len(w.Approx)
	if p := w.Precise; p != nil {
		n += 24*len(p.Router) + 8*len(p.CPU) + binary.MaxVarintLen32*len(p.Copies) + scopeBytes*len(p.Scopes) + moreBytes*len(p.More)
	}
	return n
}

// cutWorker returns what of w fits in budget bytes: with a precise index,
// its approximate list gets at most a quarter of them (the precise blocks
// are what routing is exact by), the precise blocks the rest, most recent
// first, with their copies; without one, the list gets them all. A
// precise index whose scopes alone do not fit is left out (the replica
// then follows the KV stream from its start). Linear in w's content.
func cutWorker(w *WorkerPrefix, budget int) workerCut {
	budget -= workerFixedBytes
	p := w.Precise
	if p != nil && budget < scopeBytes*len(p.Scopes) {
		p = nil
	}
	if p == nil {
		return workerCut{approx: min(len(w.Approx), max(budget, 0)/8), noPrecise: w.Precise != nil}
	}
	budget -= scopeBytes * len(p.Scopes)
	c := workerCut{approx: min(len(w.Approx), budget/4/8)}
	budget -= 8 * c.approx
	more := 0
	for c.precise < len(p.Router) {
		k := c.precise
		need := 24
		if p.CPU != nil {
			need += 8
		}
		if p.Copies != nil {
			need += uvarintLen(uint64(p.Copies[k]))
		}
		m := more
		for ; m < len(p.More) && int(p.More[m].Block) == k; m++ {
			e := p.More[m]
			need += uvarintLen(uint64(e.Block)) + 1 + uvarintLen(uint64(e.Copies))
		}
		if need > budget {
			break
		}
		budget -= need
		more = m
		c.precise++
	}
	return c
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// encodeSnapshot encodes s. When the whole would pass maxSnapshotBytes,
// each worker keeps what fits in an equal share of it, less
// snapshotSlack (cutWorker).
func encodeSnapshot(s *indexSnapshot) []byte {
	return encodeWithin(s, maxSnapshotBytes, snapshotSlack)
}

// encodeWithin is encodeSnapshot within limit bytes, slack of them left
// for the header and the workers' names and counts.
func encodeWithin(s *indexSnapshot, limit, slack int) []byte {
	ws := s.Workers[:min(len(s.Workers), maxSnapshotWorkers)]
	total := 64 + len(s.Writer)
	for i := range ws {
		total += bound(&ws[i])
	}
	cuts := make([]workerCut, len(ws))
	share := (limit - slack) / max(len(ws), 1)
	for i := range ws {
		w := &ws[i]
		switch {
		case total <= limit:
			cuts[i] = workerCut{approx: len(w.Approx)}
			if w.Precise != nil {
				cuts[i].precise = len(w.Precise.Router)
			}
		default:
			cuts[i] = cutWorker(w, share)
		}
	}
	b := make([]byte, 0, min(total, limit))
	b = append(b, snapshotMagic...)
	b = append(b, snapshotVersion)
	b = binary.AppendUvarint(b, s.DeltasSeq)
	b = binary.AppendUvarint(b, uint64(max(s.TakenAt.UnixNano(), 0)))
	b = appendString(b, s.Writer)
	b = binary.AppendUvarint(b, uint64(len(ws)))
	for i := range ws {
		w, c := &ws[i], cuts[i]
		b = appendString(b, w.Worker)
		b = binary.AppendUvarint(b, uint64(w.Rank))
		b = binary.AppendUvarint(b, uint64(c.approx))
		for _, h := range w.Approx[:c.approx] {
			b = binary.LittleEndian.AppendUint64(b, h)
		}
		if w.Precise == nil || c.noPrecise {
			b = append(b, 0)
			continue
		}
		var next uint64
		if i < len(s.KVNext) {
			next = s.KVNext[i]
		}
		b = append(b, 1)
		b = appendPrecise(b, w.Precise, next, c.precise)
	}
	return b
}

// appendPrecise appends p's precise body, its n most recent blocks.
func appendPrecise(b []byte, p *prefix.PreciseContent, next uint64, n int) []byte {
	b = binary.AppendUvarint(b, next)
	b = binary.AppendUvarint(b, uint64(max(p.BlockSize, 0)))
	b = binary.LittleEndian.AppendUint64(b, p.Groups)
	b = binary.LittleEndian.AppendUint64(b, p.CPUGroups)
	var flags byte
	if p.Live {
		flags |= 1
	}
	if p.Warming {
		flags |= 2
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(max(p.SinceClear, 0)))
	b = binary.AppendUvarint(b, uint64(n))
	for j := range n {
		b = binary.LittleEndian.AppendUint64(b, p.Router[j])
		b = binary.LittleEndian.AppendUint64(b, p.Engine[j])
		b = binary.LittleEndian.AppendUint64(b, p.Mask[j])
	}
	if p.CPU == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		for _, m := range p.CPU[:n] {
			b = binary.LittleEndian.AppendUint64(b, m)
		}
	}
	if p.Copies == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		for _, c := range p.Copies[:n] {
			b = binary.AppendUvarint(b, uint64(c))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(p.Scopes)))
	for _, sc := range p.Scopes {
		var f byte
		if sc.CPU {
			f |= 1
		}
		if sc.Local {
			f |= 2
		}
		b = append(b, f, sc.Group)
		b = binary.LittleEndian.AppendUint64(b, sc.Locality)
		b = binary.LittleEndian.AppendUint64(b, sc.Ownership)
	}
	more := p.More
	for len(more) > 0 && int(more[len(more)-1].Block) >= n {
		more = more[:len(more)-1]
	}
	b = binary.AppendUvarint(b, uint64(len(more)))
	for _, e := range more {
		b = binary.AppendUvarint(b, uint64(e.Block))
		b = append(b, e.Scope)
		b = binary.AppendUvarint(b, uint64(e.Copies))
	}
	return b
}

// decodeSnapshot decodes data, of version 2 or 1. Errors wrap errSnapshot
// and name what is wrong.
func decodeSnapshot(data []byte) (*indexSnapshot, error) {
	if len(data) > maxSnapshotBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errSnapshot, len(data), maxSnapshotBytes)
	}
	if len(data) < len(snapshotMagic)+1 || string(data[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: no %q header", errSnapshot, snapshotMagic)
	}
	version := data[len(snapshotMagic)]
	if version != snapshotVersion && version != snapshotVersion1 {
		return nil, fmt.Errorf("%w: version %d (this replica reads versions %d and %d)", errSnapshot, version, snapshotVersion1, snapshotVersion)
	}
	d := decoder{b: data[len(snapshotMagic)+1:]}
	s := &indexSnapshot{}
	s.DeltasSeq = d.uvarint("deltas sequence", 1<<63)
	s.TakenAt = time.Unix(0, int64(d.uvarint("time", 1<<62)))
	s.Writer = d.str("writer")
	n := d.uvarint("workers", maxSnapshotWorkers)
	for i := uint64(0); i < n && d.err == nil; i++ {
		w := WorkerPrefix{Worker: d.str("worker name")}
		w.Rank = uint32(d.uvarint("rank", 1<<20))
		var next uint64
		raw, k := d.fixed("approximate blocks", 8)
		w.Approx = make([]uint64, k)
		for j := range k {
			w.Approx[j] = binary.LittleEndian.Uint64(raw[8*j:])
		}
		switch d.byte1("precise flag") {
		case 0:
		case 1:
			next = d.uvarint("KV stream position", 1<<63)
			w.Precise = d.precise(version)
		default:
			d.fail("precise flag")
		}
		if d.err == nil {
			s.Workers = append(s.Workers, w)
			s.KVNext = append(s.KVNext, next)
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", errSnapshot, d.err)
	}
	return s, nil
}

// fixed reads a count, at most the bytes left after it over width, and
// that many items of width bytes.
func (d *decoder) fixed(what string, width uint64) ([]byte, int) {
	k := d.uvarint(what, uint64(len(d.b))/width)
	if d.err == nil && uint64(len(d.b)) < k*width {
		d.fail(what) // the count's own bytes left fewer
	}
	if d.err != nil {
		return nil, 0
	}
	raw := d.b[:k*width]
	d.b = d.b[k*width:]
	return raw, int(k)
}

// u64 reads a little-endian uint64.
func (d *decoder) u64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// precise reads a precise body of the version (after kv_next); nil after
// an error.
func (d *decoder) precise(version byte) *prefix.PreciseContent {
	p := &prefix.PreciseContent{BlockSize: int(d.uvarint("engine block size", 1<<20))}
	p.Groups = d.u64("precise groups")
	if version >= 2 {
		p.CPUGroups = d.u64("precise CPU groups")
	}
	flags := d.byte1("precise flags")
	if version >= 2 && flags&^3 != 0 {
		d.fail("precise flags")
	}
	p.Live, p.Warming = flags&1 != 0, flags&2 != 0
	p.SinceClear = int(d.uvarint("blocks since clear", 1<<40))
	raw, k := d.fixed("precise blocks", 24)
	p.Router, p.Engine, p.Mask = make([]uint64, k), make([]uint64, k), make([]uint64, k)
	for j := range k {
		p.Router[j] = binary.LittleEndian.Uint64(raw[24*j:])
		p.Engine[j] = binary.LittleEndian.Uint64(raw[24*j+8:])
		p.Mask[j] = binary.LittleEndian.Uint64(raw[24*j+16:])
	}
	if version < 2 || d.err != nil {
		if d.err == nil && !p.WellFormed() {
			d.fail("precise content (blocks without a block size)")
		}
		return p
	}
	switch d.byte1("CPU flag") {
	case 0:
	case 1:
		if uint64(len(d.b)) < 8*uint64(k) {
			d.fail("CPU tier")
			return nil
		}
		p.CPU = make([]uint64, k)
		for j := range k {
			p.CPU[j] = d.u64("CPU tier")
		}
	default:
		d.fail("CPU flag")
	}
	switch d.byte1("copies flag") {
	case 0:
	case 1:
		if len(d.b) < k { // a uvarint is a byte at least
			d.fail("copies")
			return nil
		}
		p.Copies = make([]uint32, k)
		for j := range k {
			p.Copies[j] = uint32(d.uvarint("copies", maxSnapshotCopies))
		}
	default:
		d.fail("copies flag")
	}
	ns := d.uvarint("scopes", min(prefix.MaxContentScopes, uint64(len(d.b))/scopeBytes))
	if d.err != nil {
		return nil
	}
	if ns > 0 {
		p.Scopes = make([]prefix.ResidencyScope, ns)
	}
	for j := range p.Scopes {
		f := d.byte1("scope flags")
		g := d.byte1("scope group")
		if f&^3 != 0 {
			d.fail("scope flags")
		}
		p.Scopes[j] = prefix.ResidencyScope{CPU: f&1 != 0, Local: f&2 != 0, Group: g,
			Locality: d.u64("scope locality"), Ownership: d.u64("scope ownership")}
	}
	nm := d.uvarint("scope copies", uint64(len(d.b))/3) // three bytes at least each
	if d.err != nil {
		return nil
	}
	if nm > 0 {
		p.More = make([]prefix.ScopeCopies, nm)
	}
	for j := range p.More {
		p.More[j] = prefix.ScopeCopies{Block: uint32(d.uvarint("scope copies' block", uint64(max(k-1, 0)))),
			Scope: d.byte1("scope copies' scope"), Copies: uint32(d.uvarint("scope copies", maxSnapshotCopies))}
	}
	if d.err == nil && !p.WellFormed() {
		d.fail("precise content (copies, scopes or their order)")
	}
	if d.err != nil {
		return nil
	}
	return p
}

// indexStore makes sure the object store of snapshots exists and returns
// it.
func (r *Replica) indexStore(ctx context.Context, js jetstream.JetStream) (jetstream.ObjectStore, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	obs, err := js.CreateOrUpdateObjectStore(cctx, jetstream.ObjectStoreConfig{
		Bucket:      r.o.Config.Name + "-index",
		Description: "Switchyard replicas' prefix-index snapshot (docs/replicas.md)",
		Storage:     jetstream.MemoryStorage,
		MaxBytes:    2*maxSnapshotBytes + 1<<20,
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s-index: %w", r.o.Config.Name, err)
	}
	return obs, nil
}

// loadSnapshot loads the latest snapshot into the Router and returns the
// deltas sequence it reflects; 0 (and no error) when there is none.
// Workers this replica does not have are skipped and counted.
func (r *Replica) loadSnapshot(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	obs, err := r.indexStore(ctx, js)
	if err != nil {
		return 0, err
	}
	data, err := readSnapshot(ctx, obs)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, nil
	}
	if err != nil {
		if errors.Is(err, errSnapshot) {
			r.m.snapshotLoads.WithLabelValues("malformed").Inc()
		}
		return 0, err
	}
	s, err := decodeSnapshot(data)
	if err != nil {
		r.m.snapshotLoads.WithLabelValues("malformed").Inc()
		return 0, err
	}
	imported, pending := 0, 0
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	for i := range s.Workers {
		w := &s.Workers[i]
		if id, ok := r.o.Resolve(w.Worker); ok && r.importLocked(id, w, s.KVNext[i]) {
			imported++
			continue
		}
		// Not a member yet (its first probe has not answered): imported
		// when it joins (Joined).
		r.pending[kvCandidate{w.Worker, w.Rank}] = pendingPrefix{w: *w, kvNext: s.KVNext[i]}
		pending++
	}
	r.m.snapshotLoads.WithLabelValues("loaded").Inc()
	r.log.Info("loaded the prefix-index snapshot", "writer", s.Writer, "taken_at", s.TakenAt.UTC().Format(time.RFC3339Nano),
		"deltas_seq", s.DeltasSeq, "bytes", len(data), "workers", imported, "workers_pending", pending)
	r.snapLoaded = &SnapshotState{Writer: s.Writer, TakenAt: s.TakenAt, DeltasSeq: s.DeltasSeq, Workers: imported}
	return s.DeltasSeq, nil
}

// snapshotReadTimeout bounds reading the snapshot at a warm start: 64 MiB
// take well under a second on a network; a var for the tests, which read
// more than that on a loaded machine under the race detector.
var snapshotReadTimeout = 30 * time.Second

// readSnapshot reads the snapshot object from obs: at most
// maxSnapshotBytes, whatever its metadata claims (a client writes the
// metadata, and the chunks are read until the last), else errSnapshot.
// jetstream.ErrObjectNotFound when there is none.
func readSnapshot(ctx context.Context, obs jetstream.ObjectStore) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, snapshotReadTimeout)
	defer cancel()
	info, err := obs.GetInfo(cctx, snapshotObject)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot info: %w", err)
	}
	if info.Size > maxSnapshotBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errSnapshot, info.Size, maxSnapshotBytes)
	}
	res, err := obs.Get(cctx, snapshotObject)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer func() { _ = res.Close() }()
	data, err := io.ReadAll(io.LimitReader(res, maxSnapshotBytes+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if len(data) > maxSnapshotBytes {
		return nil, fmt.Errorf("%w: more than %d bytes (its metadata says %d)", errSnapshot, maxSnapshotBytes, info.Size)
	}
	return data, nil
}

// pendingPrefix is a snapshot's content of a worker that was not a
// member when the snapshot was loaded.
type pendingPrefix struct {
	w      WorkerPrefix
	kvNext uint64
}

// importLocked imports w's content into the Router as worker id; false
// when id is not a member (or the content is malformed). kvNext is its
// precise index's stream position, kept for the candidate's follow when
// the precise content was taken. r.snapMu is held.
func (r *Replica) importLocked(id shared.WorkerID, w *WorkerPrefix, kvNext uint64) bool {
	ok, precise := r.o.Router.Prefix().Import(prefix.Candidate{ID: id, Rank: w.Rank}, w.Content)
	if ok && precise && kvNext > 0 {
		r.snapKV[kvCandidate{w.Worker, w.Rank}] = kvNext
	}
	return ok
}

// Pending reports whether the loaded snapshot holds content of candidate
// (worker, rank) that Joined would import: the candidate was not a member
// when the snapshot loaded and has not joined since.
func (r *Replica) Pending(worker string, rank uint32) bool {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	_, ok := r.pending[kvCandidate{worker, rank}]
	return ok
}

// Joined imports the loaded snapshot's content of candidate (worker,
// rank), which was not a member when the snapshot was loaded, now that it
// is one, as id in the Router's fleet: the daemon's membership calls it
// after a join for which Pending is true, from a goroutine of its own (an
// import can be long, and the join holds the worker manager's lock), and
// before the candidate's KV-event follow starts (so that a precise index
// taken from the snapshot is followed from the snapshot's position). Once
// per candidate; nothing when the snapshot had none. It does not call
// Options.Resolve, which takes the worker manager's lock (a replica that
// resolved here while the join held it deadlocked when a worker joined
// after the snapshot loaded, and every request with it).
func (r *Replica) Joined(worker string, rank uint32, id shared.WorkerID) {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	k := kvCandidate{worker, rank}
	p, ok := r.pending[k]
	if !ok {
		return
	}
	delete(r.pending, k)
	if r.importLocked(id, &p.w, p.kvNext) && r.snapLoaded != nil {
		r.snapLoaded.Workers++
	}
}

// writeSnapshots competes, once this replica has caught up, for the
// snapshot lease, and writes a snapshot every SnapshotInterval while it
// holds it, until ctx ends.
func (r *Replica) writeSnapshots(ctx context.Context, js jetstream.JetStream) {
	wait := time.NewTicker(100 * time.Millisecond)
	for !r.caughtUp.Load() {
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
		}
	}
	wait.Stop()
	r.HoldLease(ctx, LeaseKey("snapshot"), func(ctx context.Context) { r.writeWhileHeld(ctx, js) })
}

// writeWhileHeld writes a snapshot every SnapshotInterval until ctx ends
// (the lease is lost).
func (r *Replica) writeWhileHeld(ctx context.Context, js jetstream.JetStream) {
	r.m.snapshotWriter.Set(1)
	defer r.m.snapshotWriter.Set(0)
	t := time.NewTicker(r.o.Config.SnapshotInterval)
	defer t.Stop()
	var obs jetstream.ObjectStore
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.Connected() {
			continue
		}
		if obs == nil {
			var err error
			if obs, err = r.indexStore(ctx, js); err != nil {
				r.log.Warn("writing the prefix-index snapshot", "error", err)
				continue
			}
		}
		if err := r.writeSnapshot(ctx, obs); err != nil {
			r.m.snapshotWrites.WithLabelValues("failed").Inc()
			r.log.Warn("writing the prefix-index snapshot", "error", err)
			obs = nil // made again next time: NATS may have restarted
		}
	}
}

// writeSnapshot writes one snapshot. The sequences are read before the
// index is copied: the snapshot holds at least what the streams held up
// to them, and what came after, applied again on load, changes nothing
// (the prefix records of a booking, recorded twice, are the same blocks;
// an engine's stored or removed blocks, stored or removed again, are the
// same set).
func (r *Replica) writeSnapshot(ctx context.Context, obs jetstream.ObjectStore) error {
	s := &indexSnapshot{DeltasSeq: r.deltaSeq.Load(), TakenAt: time.Now(), Writer: r.self}
	kv := r.kvPositions()
	s.Workers = exportPrefix(r.o.Router)
	s.KVNext = make([]uint64, len(s.Workers))
	for i, w := range s.Workers {
		if w.Precise != nil {
			s.KVNext[i] = kv[kvCandidate{w.Worker, w.Rank}]
		}
	}
	data := encodeSnapshot(s)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := obs.PutBytes(cctx, snapshotObject, data); err != nil {
		return err
	}
	r.m.snapshotWrites.WithLabelValues("written").Inc()
	r.m.snapshotBytes.Set(float64(len(data)))
	return nil
}

// snapshotKVNext is the KV stream sequence the loaded snapshot's precise
// index of (worker, rank) goes on from (Options.KVStartSeq's default); 0
// (the stream's start) when the snapshot had none or it was not imported.
func (r *Replica) snapshotKVNext(worker string, rank uint32) uint64 {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	return r.snapKV[kvCandidate{worker, rank}]
}

// SnapshotState is the snapshot a replica loaded when it started.
type SnapshotState struct {
	Writer    string    `json:"writer"`
	TakenAt   time.Time `json:"taken_at"`
	DeltasSeq uint64    `json:"deltas_seq"`
	// Workers is how many workers' index content it imported.
	Workers int `json:"workers"`
}
