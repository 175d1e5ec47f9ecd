package mockworker

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/sim"
)

// DefaultKVEventsReplayBatches is how many recent batches the replay
// endpoint keeps, vLLM's KVEventsConfig.buffer_steps default
// (kvevents.DefaultBufferSteps).
const DefaultKVEventsReplayBatches = kvevents.DefaultBufferSteps

// ErrListen is wrapped by New's errors when a KV events socket cannot
// listen on its endpoint (a port in use, an address not of this host),
// as opposed to an invalid Config.
var ErrListen = errors.New("cannot listen")

// rankEndpoint returns endpoint ("tcp://host:port") with the port
// increased by rank, as vLLM offsets a data-parallel rank's KV event
// endpoints (ZmqEventPublisher.offset_endpoint_port: "rank N publishes on
// port + N"; since PR 55844 a port of 0 is left for the OS, every rank
// binding its own).
func rankEndpoint(endpoint string, rank int) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Path != "" {
		return "", fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT", endpoint)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || port < 0 || port+rank > 65535 {
		return "", fmt.Errorf("KV events endpoint %q: port %q plus data-parallel rank %d is not a port", endpoint, u.Port(), rank)
	}
	if port == 0 {
		return endpoint, nil
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port+rank)), nil
}

// kvPublisher publishes one rank's KV events with kvevents.Publisher, as
// vLLM's ZmqEventPublisher does: each batch as [topic, sequence (from 0),
// msgpack payload] on a PUB socket and, with a replay endpoint, replays
// from a ring of recent batches on a ROUTER socket, and with a snapshot
// endpoint serves snapshots. The engine goroutine builds the batch
// (kvEvent) and publishes it (flush); neither blocks: the PUB socket
// queues.
type kvPublisher struct {
	rank   int
	m      *rankMetrics
	pub    *kvevents.Publisher
	sglang bool
	// endpoints as the engine reports them (/kv_event_sources): the
	// configured ones offset by the rank, a port of 0 replaced by the
	// bound one.
	endpoint, replay, snapshot string

	// Owned by the engine goroutine: the batch being built, and the
	// request and group of its last store, which the next store of the
	// same request's next block joins.
	batch     kvevents.Batch
	lastReq   int
	lastGroup int
}

// kvEventsOptions are the publisher settings of Config.
type kvEventsOptions struct {
	endpoint, replay, snapshot, topic string
	snapshotUnavailable               bool
	encoding                          kvevents.Encoding
	replayFormat                      kvevents.ReplayFormat
	ringSize                          int
	sglang                            bool
}

// newKVPublisher listens on the options' endpoints, offset by rank.
func newKVPublisher(o kvEventsOptions, rank int, m *rankMetrics) (*kvPublisher, error) {
	ep, err := rankEndpoint(o.endpoint, rank)
	if err != nil {
		return nil, err
	}
	var rep, snap string
	if o.replay != "" {
		if rep, err = rankEndpoint(o.replay, rank); err != nil {
			return nil, err
		}
	}
	if o.snapshot != "" {
		if snap, err = rankEndpoint(o.snapshot, rank); err != nil {
			return nil, err
		}
	}
	pub, err := kvevents.NewPublisherWith(kvevents.PublisherOptions{
		Endpoint: ep, ReplayEndpoint: rep, ReplayFormat: o.replayFormat, SnapshotEndpoint: snap,
		SnapshotUnavailable: o.snapshotUnavailable, Topic: o.topic, BufferSteps: o.ringSize,
		Encoding: o.encoding, DataParallelRank: int64(rank)})
	if err != nil {
		return nil, fmt.Errorf("%w: KV events endpoint: %w", ErrListen, err)
	}
	p := &kvPublisher{rank: rank, m: m, pub: pub, sglang: o.sglang, endpoint: bound(ep, pub.Addr())}
	if rep != "" {
		p.replay = bound(rep, pub.ReplayAddr())
	}
	if snap != "" {
		p.snapshot = bound(snap, pub.SnapshotAddr())
	}
	return p, nil
}

// sglangBaseAttempts bounds newKVPublishers' search for a base port
// whose next ranks' ports are free too.
const sglangBaseAttempts = 64

// newKVPublishers listens on each rank's endpoints (newKVPublisher), one
// publisher per element of ms, in rank order. An SGLang engine reports a
// port base only, rank R on base + R (/server_info's
// endpoint_port_base), so given port 0 with several ranks it takes the
// port the OS gave rank 0 as the base and puts rank R on base + R (a
// replay or snapshot endpoint of port 0 likewise), trying a new base, at
// most sglangBaseAttempts times, while one of those ports is taken.
// Errors: newKVPublisher's (ErrListen when a port is taken).
func newKVPublishers(o kvEventsOptions, ms []*rankMetrics) ([]*kvPublisher, error) {
	consecutive := o.sglang && len(ms) > 1 && zeroPort(o.endpoint)
	for attempt := 1; ; attempt++ {
		var pubs []*kvPublisher
		var err error
		for r, m := range ms {
			ro := o
			if consecutive && r > 0 {
				ro.endpoint = withPort(o.endpoint, pubs[0].pub.Addr())
				if zeroPort(o.replay) {
					ro.replay = withPort(o.replay, pubs[0].pub.ReplayAddr())
				}
				if zeroPort(o.snapshot) {
					ro.snapshot = withPort(o.snapshot, pubs[0].pub.SnapshotAddr())
				}
			}
			var p *kvPublisher
			if p, err = newKVPublisher(ro, r, m); err != nil {
				break
			}
			pubs = append(pubs, p)
		}
		if err == nil {
			return pubs, nil
		}
		for _, p := range pubs {
			p.close()
		}
		if !consecutive || len(pubs) == 0 || !errors.Is(err, ErrListen) || attempt == sglangBaseAttempts {
			return nil, err
		}
	}
}

// zeroPort says whether endpoint ("tcp://host:port") has port 0.
func zeroPort(endpoint string) bool {
	u, err := url.Parse(endpoint)
	return err == nil && u.Port() == "0"
}

// withPort is endpoint with its port replaced by addr's (a *net.TCPAddr),
// its host kept (a wildcard stays one); endpoint when addr has no port.
func withPort(endpoint string, addr net.Addr) string {
	u, err := url.Parse(endpoint)
	a, ok := addr.(*net.TCPAddr)
	if err != nil || !ok {
		return endpoint
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(a.Port))
}

// bound is endpoint as the engine reports it: as configured, but with a
// port of 0 replaced by the port bound, and then a wildcard host by
// 127.0.0.1 (vLLM binds tcp://*:0 to the node's IP and reports that).
func bound(endpoint string, addr net.Addr) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Port() != "0" {
		return endpoint
	}
	a, ok := addr.(*net.TCPAddr)
	if !ok {
		return endpoint
	}
	host := u.Hostname()
	if host == "*" || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(a.Port))
}

func (p *kvPublisher) close() { _ = p.pub.Close() }

// flush publishes the events added since the last flush as one batch.
func (p *kvPublisher) flush() {
	p.lastReq = -1
	if len(p.batch.Events) == 0 {
		return
	}
	p.batch.TS = float64(time.Now().UnixNano()) / 1e9
	p.batch.DataParallelRank, p.batch.HasDataParallelRank = int64(p.rank), true
	_, err := p.pub.PublishBatch(&p.batch)
	p.batch.Events = p.batch.Events[:0]
	switch {
	case errors.Is(err, kvevents.ErrEncode):
		// Unreachable: the mock builds only encodable events.
		panic(fmt.Sprintf("mockworker: encoding KV events: %v", err))
	case err == nil:
		p.m.kvEventBatches.Inc()
	}
}

// kvEvent is the simulated worker's KV event hook; it adds the change to
// the batch being built. vLLM (vllm/v1/core/block_pool.py): one
// BlockStored per request and step for the blocks it cached (joining
// the request's consecutive blocks), with the blocks' token ids when
// known, block_size, lora_id and lora_name of a LoRA request, medium
// "GPU", extra_keys (one entry per block: None, or the LoRA name and, on
// block 0, the cache salt), group_idx 0 and kv_cache_spec_kind
// "full_attention"; one BlockRemoved per evicted block (medium "GPU",
// group_idx 0); AllBlocksCleared after a reset. SGLang
// (python/sglang/srt/mem_cache/radix_cache.py _record_store_event): one
// BlockStored per page and one BlockRemoved per page, no medium, no LoRA.
func (e *engine) kvEvent(ev sim.KVEvent) {
	p := e.kv
	b := &p.batch
	switch ev.Kind {
	case sim.KVBlockStored:
		a := e.reqs[ev.RequestID]
		var ids []int64
		if a != nil && a.ids != nil {
			ids = a.ids[ev.Group*ev.Tokens : (ev.Group+1)*ev.Tokens]
		}
		if p.sglang {
			p.lastReq = -1
			b.Events = append(b.Events, kvevents.Event{
				Kind: kvevents.BlockStored, BlockHashes: []uint64{ev.Hash}, ParentBlockHash: ev.Parent, HasParent: ev.Group > 0,
				TokenIDs: append([]int64(nil), ids...), BlockSize: int64(ev.Tokens)})
			return
		}
		var lora, salt string
		var loraID int64
		if a != nil {
			lora, salt, loraID = a.lora, a.salt, a.loraID
		}
		if n := len(b.Events); n > 0 && p.lastReq == ev.RequestID && p.lastGroup == ev.Group-1 {
			last := &b.Events[n-1]
			last.BlockHashes = append(last.BlockHashes, ev.Hash)
			last.TokenIDs = append(last.TokenIDs, ids...)
			last.ExtraKeys = append(last.ExtraKeys, extraKeysMsgpack(ev.Group, lora, salt))
			p.lastGroup = ev.Group
			return
		}
		p.lastReq, p.lastGroup = ev.RequestID, ev.Group
		out := kvevents.Event{
			Kind: kvevents.BlockStored, BlockHashes: []uint64{ev.Hash}, ParentBlockHash: ev.Parent, HasParent: ev.Group > 0,
			TokenIDs: append([]int64(nil), ids...), BlockSize: int64(ev.Tokens), Medium: mediumGPU,
			ExtraKeys: [][]byte{extraKeysMsgpack(ev.Group, lora, salt)}, HasGroupIdx: true, SpecKind: specFullAttention,
		}
		if lora != "" {
			out.LoRAID, out.HasLoRAID, out.LoRAName = loraID, true, []byte(lora)
		}
		b.Events = append(b.Events, out)
	case sim.KVBlockRemoved:
		p.lastReq = -1
		out := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{ev.Hash}}
		if !p.sglang {
			out.Medium, out.HasGroupIdx = mediumGPU, true
		}
		b.Events = append(b.Events, out)
	case sim.KVAllCleared:
		p.lastReq = -1
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
}

// extraKeysMsgpack is block g's extra keys as msgspec writes vLLM's tuple:
// an array of strings, or nil (None) when there are none.
func extraKeysMsgpack(g int, lora, salt string) []byte {
	k := extraKeys(g, lora, salt)
	if k == nil {
		return nil
	}
	b, err := msgpack.Marshal(k)
	if err != nil {
		panic(fmt.Sprintf("mockworker: encoding extra keys: %v", err)) // unreachable: strings
	}
	return b
}

var (
	mediumGPU         = []byte(kvevents.MediumGPU)
	specFullAttention = []byte("full_attention")
)

// flushKV publishes the KV events of the last change, if any.
func (e *engine) flushKV() {
	if e.kv != nil {
		e.kv.flush()
	}
}
