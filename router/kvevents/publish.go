package kvevents

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultBufferSteps is how many past batches a Publisher keeps for
// replay: vLLM's ZmqEventPublisher default (buffer_steps = 10_000).
const DefaultBufferSteps = 10_000

// DefaultHeartbeat is how long a Publisher with a snapshot endpoint stays
// silent before it sends an empty batch: vLLM's ZmqEventPublisher sends
// one when nothing was sent for 1 s (_publisher_thread, snapshot PR 57789
// as in vMaroon/vllm@08ee3e54).
const DefaultHeartbeat = time.Second

// Snapshot reply markers (vMaroon/vllm@08ee3e54
// vllm/distributed/kv_events_snapshot.py): the first frame of a snapshot
// reply is the last sequence the snapshot covers, 8 bytes big-endian
// signed; snapshotEmptySeq when nothing was recorded yet,
// snapshotUnavailableSeq (SNAPSHOT_UNAVAILABLE_SEQ) when the recorder
// failed, the reply then exactly [sequence, publisher id].
const (
	snapshotEmptySeq       = -1
	snapshotUnavailableSeq = -2
)

// Snapshot recorder bounds, vLLM's (KVCacheSnapshot.MAX_METADATA_BYTES,
// MAX_REFERENCES; KVEventSnapshotRecorder.MAX_REPLY_BYTES,
// EVENTS_PER_CHUNK, BLOCKS_PER_EVENT): a recorder over one of the first
// three answers unavailable from then on.
const (
	DefaultSnapshotMaxMetadataBytes = 256 << 20
	DefaultSnapshotMaxReferences    = 1_000_000
	DefaultSnapshotMaxReplyBytes    = 256 << 20
	snapshotEventsPerChunk          = 256
	snapshotBlocksPerEvent          = 1024
)

// endSeq is the replay end marker: -1 as 8 bytes big-endian.
var endSeq = binary.BigEndian.AppendUint64(nil, ^uint64(0))

// ReplayFormat is how a Publisher's replay endpoint frames its answer.
// The request is the same in both: [empty delimiter, start sequence as 8
// bytes big-endian] from a DEALER (the ROUTER sees the identity first).
type ReplayFormat uint8

// The replay formats.
const (
	// ReplayWithTopic is vLLM's since PR 45177 (vllm-project/vllm
	// tests/distributed/test_events.py@05d3142f,
	// test_replay_includes_topic): each batch with sequence >= start as
	// [identity, "", topic, sequence (8 bytes), payload], then the end
	// marker [identity, "", "", -1 (8 bytes), ""].
	ReplayWithTopic ReplayFormat = iota
	// ReplayTwoFrames is vLLM's before PR 45177 and SGLang's
	// (python/sglang/srt/disaggregation/kv_events.py@612d5790
	// _service_replay): [identity, "", sequence, payload], then
	// [identity, "", -1, ""].
	ReplayTwoFrames
)

// PublisherOptions configure NewPublisherWith. The zero value of every
// field but Endpoint is vLLM's default.
type PublisherOptions struct {
	// Endpoint is where the PUB socket listens, "tcp://HOST:PORT" (port 0:
	// a free one; Addr names it). Required.
	Endpoint string
	// ReplayEndpoint, when not "", is where a ROUTER socket answers
	// replay requests in ReplayFormat from the last BufferSteps batches.
	ReplayEndpoint string
	// ReplayFormat frames replay answers; the zero value is vLLM's
	// current ReplayWithTopic.
	ReplayFormat ReplayFormat
	// SnapshotEndpoint, when not "", enables vLLM's snapshot service (PR
	// 57789 as in vMaroon/vllm@08ee3e54): live sequence frames carry the
	// publisher id after the sequence (24 bytes), an empty batch goes out
	// after Heartbeat of silence, and a ROUTER socket there answers any
	// request with the current snapshot (see Publisher).
	SnapshotEndpoint string
	// SnapshotUnavailable makes the snapshot endpoint answer unavailable
	// from the start, as a vLLM recorder that failed does; the stream
	// keeps its publisher id and heartbeats.
	SnapshotUnavailable bool
	// SnapshotMaxReferences, SnapshotMaxMetadataBytes and
	// SnapshotMaxReplyBytes bound the snapshot recorder: past one of them
	// it answers unavailable until the publisher is closed. 0 means
	// DefaultSnapshotMaxReferences, DefaultSnapshotMaxMetadataBytes,
	// DefaultSnapshotMaxReplyBytes (vLLM's). The metadata bytes are an
	// estimate in vLLM's manner (512 + 64 per hash and token + the
	// event's size).
	SnapshotMaxReferences    int
	SnapshotMaxMetadataBytes int
	SnapshotMaxReplyBytes    int
	// Heartbeat is the silence after which a publisher with a snapshot
	// endpoint sends an empty batch; 0 means DefaultHeartbeat. Without a
	// snapshot endpoint there are no heartbeats, as in vLLM.
	Heartbeat time.Duration
	// Topic is the first frame of every live message; vLLM's default "".
	Topic string
	// BufferSteps is how many batches replay keeps; <= 0 means
	// DefaultBufferSteps.
	BufferSteps int
	// Encoding and HashBytes configure the Encoder of PublishBatch,
	// heartbeats and snapshot chunks.
	Encoding  Encoding
	HashBytes bool
	// DataParallelRank is set on heartbeats, snapshot chunks and batches
	// given to PublishBatch without a rank (vLLM's publish does the same).
	DataParallelRank int64
}

// Publisher publishes batches as vLLM's ZmqEventPublisher does: a PUB
// socket sending [topic, sequence, payload] with sequences from 0
// (sequence 8 bytes big-endian; with a snapshot endpoint 24 bytes, the
// sequence then the publisher's 16-byte id), an optional ROUTER socket
// replaying buffered batches from a requested sequence, and an optional
// snapshot service. For the mock engine and tests. Safe for concurrent
// use; no lock is held while a socket may block (a PUB send only
// queues). zmq4 v0.17.0 leaves one idle goroutine behind per closed PUB
// socket (its writer is never closed), so make one per process rather
// than one per request.
//
// Snapshots (vMaroon/vllm@08ee3e54 vllm/distributed/kv_events_snapshot.py
// and tests/distributed/test_kv_events_snapshot.py): every batch given
// to PublishBatch is folded into the snapshot before it is sent, so a
// snapshot requested after a batch was received covers it. A request
// (any frames; a REQ client sends one, vLLM's client b"snapshot") is
// answered [cut, id, chunk...]: cut the last sequence folded (8 bytes
// big-endian signed; -1 before any), id the publisher's, and each chunk
// an ordinary batch payload of at most 256 events: the retained
// BlockStored events verbatim in their original order (a store is kept
// while a block it stored is resident, or while a kept store depends on
// it as parent or, for a tokenless store, for its metadata), stores
// repeated until every block reaches its residency count, then
// BlockRemoved events (at most 1024 hashes each) taking away the excess.
// Residency is counted per (medium, group, hash); AllBlocksCleared
// clears the GPU tier (medium "GPU" or none). An unavailable recorder
// (SnapshotUnavailable, a bound passed, a store whose parent or metadata
// was never seen, or a payload given to Publish that the recorder cannot
// read) answers exactly [-2, id] until Close.
type Publisher struct {
	o      PublisherOptions
	id     []byte // 16-byte publisher id; nil without snapshots
	pub    zmq4.Socket
	router zmq4.Socket // nil without replay
	snap   zmq4.Socket // nil without snapshots
	cancel context.CancelFunc
	wg     sync.WaitGroup
	quit   chan struct{}

	mu       sync.Mutex
	seq      uint64
	buf      []entry // ring of the last cap(buf) batches
	start    int     // index of the oldest in buf once full
	closed   bool
	enc      Encoder
	lastSend time.Time
	// Snapshot state, with snapshots: rec the folded stream, cut the
	// last sequence folded (-1 before any), failed once the recorder
	// gave up.
	rec    *snapshotState
	cut    int64
	failed bool
}

type entry struct {
	seq     uint64
	payload []byte
}

// NewPublisher listens on endpoint (e.g. "tcp://127.0.0.1:0") and, when
// replayEndpoint is not "", serves replays there in the two-frame format
// (ReplayTwoFrames: vLLM before PR 45177, SGLang), keeping bufferSteps
// batches (<= 0: DefaultBufferSteps). Close stops it. NewPublisherWith
// offers the other formats and the snapshot service.
func NewPublisher(endpoint, replayEndpoint, topic string, bufferSteps int) (*Publisher, error) {
	return NewPublisherWith(PublisherOptions{Endpoint: endpoint, ReplayEndpoint: replayEndpoint,
		ReplayFormat: ReplayTwoFrames, Topic: topic, BufferSteps: bufferSteps})
}

// NewPublisherWith listens on o's endpoints and starts serving them.
// Errors: an endpoint that cannot be listened on (wrapped, naming it),
// an unknown ReplayFormat or a negative bound.
func NewPublisherWith(o PublisherOptions) (*Publisher, error) {
	if o.BufferSteps <= 0 {
		o.BufferSteps = DefaultBufferSteps
	}
	if o.ReplayFormat > ReplayTwoFrames {
		return nil, fmt.Errorf("kv events publisher: replay format %d is not one of kvevents' formats", o.ReplayFormat)
	}
	if o.Heartbeat < 0 || o.SnapshotMaxReferences < 0 || o.SnapshotMaxMetadataBytes < 0 || o.SnapshotMaxReplyBytes < 0 {
		return nil, errors.New("kv events publisher: negative heartbeat or snapshot bound")
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.SnapshotMaxReferences == 0 {
		o.SnapshotMaxReferences = DefaultSnapshotMaxReferences
	}
	if o.SnapshotMaxMetadataBytes == 0 {
		o.SnapshotMaxMetadataBytes = DefaultSnapshotMaxMetadataBytes
	}
	if o.SnapshotMaxReplyBytes == 0 {
		o.SnapshotMaxReplyBytes = DefaultSnapshotMaxReplyBytes
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{o: o, pub: zmq4.NewPub(ctx), cancel: cancel, quit: make(chan struct{}),
		buf: make([]entry, 0, o.BufferSteps), enc: Encoder{Encoding: o.Encoding, HashBytes: o.HashBytes},
		cut: snapshotEmptySeq, lastSend: time.Now()}
	fail := func(err error) (*Publisher, error) {
		cancel()
		_ = p.pub.Close()
		if p.router != nil {
			_ = p.router.Close()
		}
		if p.snap != nil {
			_ = p.snap.Close()
		}
		return nil, err
	}
	if err := p.pub.Listen(o.Endpoint); err != nil {
		return fail(fmt.Errorf("kv events publisher: listen %s: %w", o.Endpoint, err))
	}
	if o.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen(o.ReplayEndpoint); err != nil {
			return fail(fmt.Errorf("kv events publisher: listen %s: %w", o.ReplayEndpoint, err))
		}
	}
	if o.SnapshotEndpoint != "" {
		// A slow requester cannot hold the service: a reply that cannot
		// be queued within a few seconds is dropped (vLLM: SNDTIMEO 100
		// ms, the requester retries).
		p.snap = zmq4.NewRouter(ctx, zmq4.WithTimeout(5*time.Second))
		if err := p.snap.Listen(o.SnapshotEndpoint); err != nil {
			return fail(fmt.Errorf("kv events publisher: listen %s: %w", o.SnapshotEndpoint, err))
		}
		p.id = make([]byte, 16)
		_, _ = rand.Read(p.id)
		p.id[6] = p.id[6]&0x0f | 0x40 // a version 4 UUID, as uuid.uuid4()
		p.id[8] = p.id[8]&0x3f | 0x80
		p.rec = newSnapshotState(o.SnapshotMaxReferences, o.SnapshotMaxMetadataBytes)
		p.failed = o.SnapshotUnavailable
	}
	if p.router != nil {
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	if p.snap != nil {
		p.wg.Add(2)
		go p.serveSnapshots(ctx)
		go p.heartbeats()
	}
	return p, nil
}

// Addr is the PUB socket's address.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay ROUTER socket's address, nil without replay.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

// SnapshotAddr is the snapshot ROUTER socket's address, nil without
// snapshots.
func (p *Publisher) SnapshotAddr() net.Addr {
	if p.snap == nil {
		return nil
	}
	return p.snap.Addr()
}

// ID returns a copy of the publisher's 16-byte id (a random version 4
// UUID, new for every Publisher, as vLLM's uuid.uuid4() per publisher
// lifetime), or nil without snapshots.
func (p *Publisher) ID() []byte { return append([]byte(nil), p.id...) }

// Publish sends payload under the next sequence number and returns it.
// The payload is copied into the replay buffer. With snapshots the
// recorder cannot read a payload it was not given as a Batch, so Publish
// makes the snapshot service unavailable (use PublishBatch).
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("kv events publisher: closed")
	}
	if p.rec != nil && !p.failed {
		p.failSnapshotsLocked()
	}
	return p.sendLocked(payload)
}

// PublishBatch encodes b with the publisher's Encoder (its rank set to
// DataParallelRank when it has none; b is not modified), folds it into
// the snapshot, and sends it under the next sequence number, which it
// returns. Errors: a batch the Encoder refuses (ErrEncode; nothing is
// sent), a closed publisher.
func (p *Publisher) PublishBatch(b *Batch) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("kv events publisher: closed")
	}
	return p.publishBatchLocked(b)
}

func (p *Publisher) publishBatchLocked(b *Batch) (uint64, error) {
	c := *b
	if !c.HasDataParallelRank {
		c.DataParallelRank, c.HasDataParallelRank = p.o.DataParallelRank, true
	}
	payload, err := p.enc.Encode(&c)
	if err != nil {
		return 0, fmt.Errorf("kv events publisher: %w", err)
	}
	if p.rec != nil && !p.failed {
		// Recorded before it is sent: a snapshot requested by anyone who
		// received the batch covers it.
		if err := p.rec.apply(c.Events); err != nil {
			p.failSnapshotsLocked()
		} else {
			p.cut = int64(p.seq)
		}
	}
	return p.sendLocked(payload)
}

// failSnapshotsLocked makes the snapshot service unavailable until Close,
// dropping what it recorded.
func (p *Publisher) failSnapshotsLocked() {
	p.failed = true
	p.rec = newSnapshotState(0, 0)
}

// record takes the next sequence number for a copy of payload and keeps
// it for replay. p.mu is held.
func (p *Publisher) record(payload []byte) entry {
	e := entry{seq: p.seq, payload: append([]byte(nil), payload...)}
	p.seq++
	if len(p.buf) < cap(p.buf) {
		p.buf = append(p.buf, e)
	} else {
		p.buf[p.start] = e
		p.start = (p.start + 1) % len(p.buf)
	}
	return e
}

// sendLocked takes the next sequence number for payload, keeps a copy for
// replay and sends it. p.mu is held; the PUB socket only queues.
func (p *Publisher) sendLocked(payload []byte) (uint64, error) {
	e := p.record(payload)
	p.lastSend = time.Now()
	seq := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(p.id)), e.seq)
	seq = append(seq, p.id...)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.o.Topic), seq, e.payload)); err != nil {
		return e.seq, fmt.Errorf("kv events publisher: send: %w", err)
	}
	return e.seq, nil
}

// heartbeats sends an empty batch whenever nothing was sent for
// o.Heartbeat, checking ten times per interval (vLLM checks every 0.1 s
// for its 1 s).
func (p *Publisher) heartbeats() {
	defer p.wg.Done()
	t := time.NewTicker(max(p.o.Heartbeat/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if !p.closed && time.Since(p.lastSend) >= p.o.Heartbeat {
			_, _ = p.publishBatchLocked(&Batch{TS: unixSeconds(time.Now())})
		}
		p.mu.Unlock()
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// serveReplay answers replay requests until ctx ends.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		// [identity, empty, start] as vLLM's _service_replay expects.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		out := make([]entry, 0, len(p.buf))
		for i := range p.buf {
			if e := p.buf[(p.start+i)%len(p.buf)]; e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			seq := binary.BigEndian.AppendUint64(nil, e.seq)
			if p.o.ReplayFormat == ReplayWithTopic {
				_ = p.router.Send(zmq4.NewMsgFrom(id, nil, []byte(p.o.Topic), seq, e.payload))
			} else {
				_ = p.router.Send(zmq4.NewMsgFrom(id, nil, seq, e.payload))
			}
		}
		if p.o.ReplayFormat == ReplayWithTopic {
			_ = p.router.Send(zmq4.NewMsgFrom(id, nil, nil, endSeq, nil))
		} else {
			_ = p.router.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil))
		}
	}
}

// serveSnapshots answers snapshot requests until ctx ends.
func (p *Publisher) serveSnapshots(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.snap.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) == 0 {
			continue
		}
		// The reply goes back under the request's envelope: the frames up
		// to the empty delimiter (a REQ or DEALER client's), else the
		// identity alone (vLLM's _serve).
		env := msg.Frames[:1]
		for i := 1; i < len(msg.Frames); i++ {
			if len(msg.Frames[i]) == 0 {
				env = msg.Frames[:i+1]
				break
			}
		}
		reply := p.snapshotReply()
		_ = p.snap.Send(zmq4.NewMsgFrom(append(append([][]byte(nil), env...), reply...)...))
	}
}

// snapshotReply is [cut, id, chunk...] now, or [-2, id].
func (p *Publisher) snapshotReply() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.failed {
		reply := [][]byte{binary.BigEndian.AppendUint64(nil, uint64(p.cut)), p.ID()}
		events := p.rec.export(snapshotBlocksPerEvent)
		ts := unixSeconds(time.Now())
		size := 0
		for len(events) > 0 {
			n := min(len(events), snapshotEventsPerChunk)
			payload, err := p.enc.Encode(&Batch{TS: ts, Events: events[:n],
				DataParallelRank: p.o.DataParallelRank, HasDataParallelRank: true})
			if err != nil {
				p.failSnapshotsLocked()
				break
			}
			if size += len(payload); size > p.o.SnapshotMaxReplyBytes {
				p.failSnapshotsLocked()
				break
			}
			reply = append(reply, append([]byte(nil), payload...))
			events = events[n:]
		}
		if !p.failed {
			return reply
		}
	}
	unavailable := int64(snapshotUnavailableSeq)
	return [][]byte{binary.BigEndian.AppendUint64(nil, uint64(unavailable)), p.ID()}
}

// Close stops publishing, replaying and snapshots, and waits for the
// publisher's goroutines.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.quit)
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	if p.snap != nil {
		err = errors.Join(err, p.snap.Close())
	}
	p.wg.Wait()
	return err
}
