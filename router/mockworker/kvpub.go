package mockworker

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

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
// endpoints (KVEventsConfig: "rank N publishes on port + N").
func rankEndpoint(endpoint string, rank int) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Path != "" {
		return "", fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT", endpoint)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || port < 0 || port+rank > 65535 || (port == 0 && rank > 0) {
		return "", fmt.Errorf("KV events endpoint %q: port %q plus data-parallel rank %d is not a port", endpoint, u.Port(), rank)
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port+rank)), nil
}

// kvPublisher publishes one rank's KV events with kvevents.Publisher, as
// vLLM's ZmqEventPublisher does: each batch as [topic, sequence (from 0),
// msgpack payload] on a PUB socket and, with a replay endpoint, replays
// from a ring of recent batches on a ROUTER socket. The engine goroutine
// builds the batch (kvEvent) and publishes it (flush); neither blocks:
// the PUB socket queues.
type kvPublisher struct {
	rank int
	m    *rankMetrics
	pub  *kvevents.Publisher

	// Owned by the engine goroutine.
	enc   kvevents.Encoder
	batch kvevents.Batch
}

// kvEventsOptions are the publisher settings of Config.
type kvEventsOptions struct {
	endpoint, replay, topic string
	encoding                kvevents.Encoding
	ringSize                int
}

// newKVPublisher listens on the options' endpoints, offset by rank.
func newKVPublisher(o kvEventsOptions, rank int, m *rankMetrics) (*kvPublisher, error) {
	ep, err := rankEndpoint(o.endpoint, rank)
	if err != nil {
		return nil, err
	}
	var rep string
	if o.replay != "" {
		if rep, err = rankEndpoint(o.replay, rank); err != nil {
			return nil, err
		}
	}
	pub, err := kvevents.NewPublisher(ep, rep, o.topic, o.ringSize)
	if err != nil {
		return nil, fmt.Errorf("%w: KV events endpoint: %w", ErrListen, err)
	}
	return &kvPublisher{rank: rank, m: m, pub: pub, enc: kvevents.Encoder{Encoding: o.encoding}}, nil
}

func (p *kvPublisher) close() { _ = p.pub.Close() }

// flush publishes the events added since the last flush as one batch.
func (p *kvPublisher) flush() {
	if len(p.batch.Events) == 0 {
		return
	}
	p.batch.TS = float64(time.Now().UnixNano()) / 1e9
	p.batch.DataParallelRank, p.batch.HasDataParallelRank = int64(p.rank), true
	payload, err := p.enc.Encode(&p.batch)
	p.batch.Events = p.batch.Events[:0]
	if err != nil {
		// Unreachable: the mock builds only encodable events.
		panic(fmt.Sprintf("mockworker: encoding KV events: %v", err))
	}
	// Publish copies the payload; it fails only once closed.
	if _, err := p.pub.Publish(payload); err == nil {
		p.m.kvEventBatches.Inc()
	}
}

// kvEvent is the simulated worker's KV event hook: it adds the change to
// the batch being built, merging a store that continues the previous
// store's chain (the request's next group) into it, and consecutive
// removals into one event, as vLLM reports one step's blocks together.
// Stored groups carry their token ids when the request's prompt is known
// as ids.
func (e *engine) kvEvent(ev sim.KVEvent) {
	b := &e.kv.batch
	var last *kvevents.Event
	if n := len(b.Events); n > 0 {
		last = &b.Events[n-1]
	}
	switch ev.Kind {
	case sim.KVBlockStored:
		var ids []int64
		if a := e.reqs[ev.RequestID]; a != nil && a.ids != nil {
			ids = a.ids[ev.Group*ev.Tokens : (ev.Group+1)*ev.Tokens]
		}
		if last != nil && last.Kind == kvevents.BlockStored && ev.Group > 0 &&
			last.BlockHashes[len(last.BlockHashes)-1] == ev.Parent && last.BlockSize == int64(ev.Tokens) &&
			(len(last.TokenIDs) > 0) == (ids != nil) {
			last.BlockHashes = append(last.BlockHashes, ev.Hash)
			last.TokenIDs = append(last.TokenIDs, ids...)
			return
		}
		b.Events = append(b.Events, kvevents.Event{
			Kind: kvevents.BlockStored, BlockHashes: []uint64{ev.Hash},
			ParentBlockHash: ev.Parent, HasParent: ev.Group > 0,
			TokenIDs: append([]int64(nil), ids...), BlockSize: int64(ev.Tokens), Medium: mediumGPU,
		})
	case sim.KVBlockRemoved:
		if last != nil && last.Kind == kvevents.BlockRemoved {
			last.BlockHashes = append(last.BlockHashes, ev.Hash)
			return
		}
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{ev.Hash}, Medium: mediumGPU})
	case sim.KVAllCleared:
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	}
}

var mediumGPU = []byte(kvevents.MediumGPU)

// flushKV publishes the KV events of the last change, if any.
func (e *engine) flushKV() {
	if e.kv != nil {
		e.kv.flush()
	}
}
