package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// MaxFrameBytes bounds one ZeroMQ frame the subscriber reads from an
// engine: 64 MiB, above any payload the decoder accepts (MaxPayloadBytes
// by default; Options.MaxPayload is capped at it). zmq4 v0.17.0 allocates
// whatever length a peer declares for a frame, up to 2^63 bytes, so a
// broken or hostile endpoint could make it allocate without bound (or
// panic); the subscriber's tcp:// connections are read through a frame
// parser that refuses a longer frame first, closing the connection,
// which the subscriber then dials again (with backoff) like any other
// broken connection.
const MaxFrameBytes = 64 << 20

// maxMessageBytes bounds one whole message (every frame of it) read from
// a live or replay socket: a frame of MaxFrameBytes and 1 MiB for the
// others (the topic and the sequence), so that a peer cannot make zmq4
// hold many frames of MaxFrameBytes as one message. A snapshot reply is
// bounded by Options.MaxSnapshotBytes instead (withLimits).
const maxMessageBytes = MaxFrameBytes + 1<<20

// frameOverhead is what each frame counts towards a message's bound on
// top of its body: zmq4 allocates a slice per frame, so a message of many
// empty frames is bounded too.
const frameOverhead = 64

// frameLimits are the bounds a dialled connection enforces: one frame's
// body, and one message's frames (bodies plus frameOverhead each).
type frameLimits struct{ frame, message uint64 }

type limitsKey struct{}

// withLimits returns ctx carrying l for the sockets made with it (zmq4
// dials with the socket's context, so boundedTCP.Dial finds it there).
func withLimits(ctx context.Context, l frameLimits) context.Context {
	return context.WithValue(ctx, limitsKey{}, l)
}

// boundedNetwork is the zmq4 transport name the subscriber dials tcp://
// endpoints with: TCP read through frameLimiter.
const boundedNetwork = "switchyard-bounded-tcp"

// errFrameTooLarge: a peer declared a frame over MaxFrameBytes.
var errFrameTooLarge = errors.New("ZeroMQ frame over the size limit")

func init() {
	// Registered once, at init, like the transports zmq4 itself registers;
	// the name is ours, so it cannot clash with another package's.
	if err := zmq4.RegisterTransport(boundedNetwork, boundedTCP{transport.New("tcp")}); err != nil {
		panic(err)
	}
}

// bounded returns endpoint on the bounded transport when it is tcp://
// (other schemes, ipc:// for a local engine, are dialled as given).
func bounded(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		return boundedNetwork + "://" + rest
	}
	return endpoint
}

// handshakeTimeout bounds a dialled connection's ZMTP handshake, until the
// peer's first command (its READY): zmq4 v0.17.0 reads the greeting and
// the handshake without a deadline, so a peer that accepts the connection
// and says nothing would hold the dial for ever. A variable for tests.
var handshakeTimeout = 10 * time.Second

// boundedTCP is TCP whose dialled connections refuse frames over their
// bounds (MaxFrameBytes and maxMessageBytes, or withLimits'), bound the
// handshake (handshakeTimeout) and close when the socket's context ends
// (zmq4 does not close a connection still in its handshake).
type boundedTCP struct{ transport.Transport }

func (t boundedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	l := frameLimits{frame: MaxFrameBytes, message: maxMessageBytes}
	if v, ok := ctx.Value(limitsKey{}).(frameLimits); ok {
		l = v
	}
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		_ = c.Close()
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = c.Close() })
	return &frameLimiter{Conn: c, max: l.frame, maxMsg: l.message, handshaking: true}, nil
}

// frameLimiter follows the ZMTP 3 stream a connection reads (RFC 23 and
// 37: a 64-byte greeting, then frames of a flags byte, a 1-byte or, with
// the LONG flag, 8-byte big-endian size, and that many bytes of body;
// commands and messages alike) and fails the read that would deliver a
// frame header declaring more than max bytes, or taking the message's
// frames over maxMsg (each frame's body plus frameOverhead; commands are
// not part of a message). It parses only what passes through, a few
// instructions per header, so it adds no copy.
type frameLimiter struct {
	net.Conn
	max, maxMsg uint64
	msg         uint64 // the current message's frames so far
	// handshaking: the connection's deadline is the handshake's, lifted
	// once the peer's first command has been read.
	handshaking bool
	cmd         bool // the current frame is a command

	greeting int     // greeting bytes still to pass
	body     uint64  // body bytes of the current frame still to pass
	hdr      [9]byte // the frame header read so far
	hdrN     int
	err      error
}

// frameRead notes a frame read whole: the first command ends the
// handshake's deadline.
func (f *frameLimiter) frameRead() {
	if f.cmd && f.handshaking {
		f.handshaking = false
		_ = f.Conn.SetDeadline(time.Time{})
	}
}

// zmtpGreeting is the length of the ZMTP 3 greeting.
const zmtpGreeting = 64

// Read reads from the connection and checks every frame header in what
// it read.
func (f *frameLimiter) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.Conn.Read(p)
	if cerr := f.check(p[:n]); cerr != nil {
		f.err = cerr
		_ = f.Conn.Close()
		return 0, cerr
	}
	return n, err
}

// check advances the parser over b.
func (f *frameLimiter) check(b []byte) error {
	for len(b) > 0 {
		switch {
		case f.greeting < zmtpGreeting:
			k := min(zmtpGreeting-f.greeting, len(b))
			f.greeting += k
			b = b[k:]
		case f.body > 0:
			k := uint64(len(b))
			if k > f.body {
				k = f.body
			}
			f.body -= k
			b = b[k:]
			if f.body == 0 {
				f.frameRead()
			}
		default:
			f.hdr[f.hdrN] = b[0]
			f.hdrN++
			b = b[1:]
			long := f.hdr[0]&0x02 != 0
			switch {
			case !long && f.hdrN == 2:
				f.body, f.hdrN = uint64(f.hdr[1]), 0
			case long && f.hdrN == 9:
				f.body, f.hdrN = binary.BigEndian.Uint64(f.hdr[1:9]), 0
				if f.body > f.max {
					return fmt.Errorf("%w: a frame of %d bytes declared, the limit is %d", errFrameTooLarge, f.body, f.max)
				}
			default:
				continue
			}
			if f.cmd = f.hdr[0]&0x04 != 0; f.cmd { // a command, not part of a message
				if f.body == 0 {
					f.frameRead()
				}
				continue
			}
			f.msg += f.body + frameOverhead
			if f.msg > f.maxMsg {
				return fmt.Errorf("%w: a message of over %d bytes, the limit is %d", errFrameTooLarge, f.msg, f.maxMsg)
			}
			if f.hdr[0]&0x01 == 0 { // the message's last frame
				f.msg = 0
			}
		}
	}
	return nil
}
