package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// DefaultBufferSteps is how many past batches a Publisher keeps for
// replay: vLLM's ZmqEventPublisher default (buffer_steps = 10_000).
const DefaultBufferSteps = 10_000

// endSeq is the replay end marker: -1 as 8 bytes big-endian.
var endSeq = binary.BigEndian.AppendUint64(nil, ^uint64(0))

// Publisher publishes payloads as vLLM's ZmqEventPublisher does: a PUB
// socket sending [topic, sequence, payload] with sequences from 0, and an
// optional ROUTER socket replaying buffered batches from a requested
// sequence (see the package doc). For the mock engine and tests. Safe for
// concurrent use. zmq4 v0.17.0 leaves one idle goroutine behind per
// closed PUB socket (its writer is never closed), so make one per process
// rather than one per request.
type Publisher struct {
	topic  string
	pub    zmq4.Socket
	router zmq4.Socket // nil without replay
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	seq    uint64
	buf    []entry // ring of the last cap(buf) batches
	start  int     // index of the oldest in buf once full
	closed bool
}

type entry struct {
	seq     uint64
	payload []byte
}

// NewPublisher listens on endpoint (e.g. "tcp://127.0.0.1:0") and, when
// replayEndpoint is not "", serves replays there, keeping bufferSteps
// batches (<= 0: DefaultBufferSteps). Close stops it.
func NewPublisher(endpoint, replayEndpoint, topic string, bufferSteps int) (*Publisher, error) {
	if bufferSteps <= 0 {
		bufferSteps = DefaultBufferSteps
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{topic: topic, pub: zmq4.NewPub(ctx), cancel: cancel, done: make(chan struct{}), buf: make([]entry, 0, bufferSteps)}
	if err := p.pub.Listen(endpoint); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("kv events publisher: listen %s: %w", endpoint, err)
	}
	if replayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx)
	if err := p.router.Listen(replayEndpoint); err != nil {
		cancel()
		_ = p.pub.Close()
		_ = p.router.Close()
		return nil, fmt.Errorf("kv events publisher: listen %s: %w", replayEndpoint, err)
	}
	go p.serveReplay(ctx)
	return p, nil
}

// Addr is the PUB socket's address; ReplayAddr the ROUTER's (nil without).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay ROUTER socket's address, nil without replay.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

// Publish sends payload under the next sequence number and returns it.
// The payload is copied into the replay buffer.
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("kv events publisher: closed")
	}
	e := p.record(payload)
	if err := p.pub.Send(Message(p.topic, e.seq, e.payload)); err != nil {
		return e.seq, fmt.Errorf("kv events publisher: send: %w", err)
	}
	return e.seq, nil
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

// serveReplay answers replay requests until ctx ends.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer close(p.done)
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
			_ = p.router.Send(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, e.seq), e.payload))
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// Close stops publishing and replaying.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	<-p.done
	return err
}
