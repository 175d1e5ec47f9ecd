package mockworker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/switchyard-router/switchyard/router/kvevents"
	"github.com/switchyard-router/switchyard/router/sim"
)

// Defaults of the KV event publisher.
const (
	// DefaultKVEventsReplayBatches is how many recent batches the replay
	// endpoint keeps, vLLM's KVEventsConfig.buffer_steps default.
	DefaultKVEventsReplayBatches = 10_000
	// kvEventsHWM bounds the batches queued on the PUB socket for its
	// subscribers (vLLM's hwm default, 100,000, is for a real GPU's rate);
	// beyond it a batch is dropped and subscribers see a sequence gap.
	kvEventsHWM = 10_000
)

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

// kvPublisher publishes one rank's KV events as vLLM's ZmqEventPublisher
// does: each batch as [topic, sequence (8 bytes big-endian, from 0),
// msgpack payload] on a PUB socket, and, with a replay endpoint, answers
// replay requests on a ROUTER socket from a ring of recent batches.
//
// The engine goroutine calls add (while building a batch) and flush;
// those never block: the PUB socket queues (bounded by kvEventsHWM), the
// ring is under a mutex held only to copy, and the replay goroutine sends
// outside it.
type kvPublisher struct {
	rank  int
	topic string
	m     *rankMetrics

	ctx    context.Context
	cancel context.CancelFunc
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	wg     sync.WaitGroup

	// Owned by the engine goroutine.
	enc   kvevents.Encoder
	batch kvevents.Batch
	seq   uint64

	mu   sync.Mutex
	ring []kvRecord // the last cap(ring) batches, oldest at head
	head int
}

// kvRecord is a published batch kept for replay.
type kvRecord struct {
	seq     uint64
	payload []byte
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
	ctx, cancel := context.WithCancel(context.Background())
	p := &kvPublisher{rank: rank, topic: o.topic, m: m, ctx: ctx, cancel: cancel,
		enc: kvevents.Encoder{Encoding: o.encoding}}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, kvEventsHWM); err != nil {
		p.close()
		return nil, fmt.Errorf("KV events: %w", err)
	}
	if err := p.pub.Listen(ep); err != nil {
		p.close()
		return nil, fmt.Errorf("%w: KV events endpoint %s: %w", ErrListen, ep, err)
	}
	if o.replay != "" {
		rep, err := rankEndpoint(o.replay, rank)
		if err != nil {
			p.close()
			return nil, err
		}
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(rep); err != nil {
			p.close()
			return nil, fmt.Errorf("%w: KV events replay endpoint %s: %w", ErrListen, rep, err)
		}
		p.ring = make([]kvRecord, 0, o.ringSize)
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// addr returns the PUB socket's address (its port when listening on 0).
func (p *kvPublisher) addr() net.Addr { return p.pub.Addr() }

// replayAddr returns the ROUTER socket's address, nil without one.
func (p *kvPublisher) replayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

func (p *kvPublisher) close() {
	p.cancel()
	if p.pub != nil {
		p.pub.Close()
	}
	if p.replay != nil {
		p.replay.Close()
	}
	p.wg.Wait()
}

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
	payload = append([]byte(nil), payload...)
	seq := p.seq
	p.seq++
	if p.replay != nil {
		p.mu.Lock()
		if len(p.ring) < cap(p.ring) {
			p.ring = append(p.ring, kvRecord{seq, payload})
		} else {
			p.ring[p.head] = kvRecord{seq, payload}
			p.head = (p.head + 1) % len(p.ring)
		}
		p.mu.Unlock()
	}
	// The PUB socket queues without blocking; past its high-water mark it
	// drops the batch silently, which subscribers see as a sequence gap.
	// It fails only once closed.
	if p.pub.Send(kvevents.Message(p.topic, seq, payload)) == nil {
		p.m.kvEventBatches.Inc()
	}
}

// endSeq is the replay end marker, -1 as 8 bytes big-endian.
var endSeq = binary.BigEndian.AppendUint64(nil, ^uint64(0))

// serveReplay answers replay requests until the publisher closes: a
// request [identity, "", start sequence] gets every kept batch from start
// on as [identity, "", sequence, payload], then [identity, "", -1, ""]
// (vLLM's ZmqEventPublisher._service_replay). A malformed request is
// ignored, as vLLM does.
func (p *kvPublisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		for _, r := range p.since(start) {
			if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, r.seq), r.payload)); err != nil {
				break
			}
		}
		if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil)); err != nil && p.ctx.Err() != nil {
			return
		}
	}
}

// since returns the kept batches with sequence >= start, oldest first.
func (p *kvPublisher) since(start uint64) []kvRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []kvRecord
	for i := range p.ring {
		if r := p.ring[(p.head+i)%len(p.ring)]; r.seq >= start {
			out = append(out, r)
		}
	}
	return out
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
