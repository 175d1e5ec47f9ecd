package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
)

// zmtpStream is a ZMTP 3 greeting followed by frames of the given body
// sizes (short frames up to 255 bytes, long ones beyond), bodies zeroed
// except for sizes above limit, whose header alone is written.
func zmtpStream(limit uint64, sizes ...uint64) []byte {
	b := bytes.Repeat([]byte{0xff}, zmtpGreeting)
	for _, n := range sizes {
		if n <= 255 {
			b = append(b, 0x00, byte(n))
		} else {
			b = append(b, 0x02)
			b = binary.BigEndian.AppendUint64(b, n)
		}
		if n <= limit {
			b = append(b, make([]byte, n)...)
		}
	}
	return b
}

// The frame parser passes frames up to the limit however the stream is
// cut into reads, and fails at the header of a longer one, closing the
// connection.
func TestFrameLimiter(t *testing.T) {
	const limit = 1000
	ok := zmtpStream(limit, 0, 5, 255, 256, 1000, 3)
	for _, chunk := range []int{1, 2, 7, 64, len(ok)} {
		client, server := net.Pipe()
		go func() {
			for b := ok; len(b) > 0; b = b[min(chunk, len(b)):] {
				_, _ = server.Write(b[:min(chunk, len(b))])
			}
			_ = server.Close()
		}()
		f := &frameLimiter{Conn: client, max: limit, maxMsg: 1 << 40}
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, ok) {
			t.Fatalf("chunks of %d: read %d of %d bytes, %v", chunk, len(got), len(ok), err)
		}
	}

	for _, size := range []uint64{limit + 1, 1 << 62, ^uint64(0)} {
		bad := zmtpStream(limit, 10, size)
		client, server := net.Pipe()
		go func() { _, _ = server.Write(bad); _ = server.Close() }()
		f := &frameLimiter{Conn: client, max: limit, maxMsg: 1 << 40}
		_, err := io.ReadAll(f)
		if !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("frame of %d bytes: %v, want errFrameTooLarge", size, err)
		}
		if _, err := f.Read(make([]byte, 1)); !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("read after the refusal: %v", err)
		}
	}
}

// A message is bounded as a whole: frames of 100 bytes sent with the MORE
// flag (one message) fail once the message passes its limit, counting
// frameOverhead per frame; the same frames as separate messages pass;
// commands do not count.
func TestFrameLimiterMessage(t *testing.T) {
	const frames = 20
	stream := func(more bool) []byte {
		b := bytes.Repeat([]byte{0xff}, zmtpGreeting)
		b = append(b, 0x04, 200) // a command of 200 bytes
		b = append(b, make([]byte, 200)...)
		for i := range frames {
			flags := byte(0)
			if more && i < frames-1 {
				flags = 0x01
			}
			b = append(b, flags, 100)
			b = append(b, make([]byte, 100)...)
		}
		return b
	}
	const maxMsg = 10 * (100 + frameOverhead)
	for _, more := range []bool{false, true} {
		client, server := net.Pipe()
		go func() { _, _ = server.Write(stream(more)); _ = server.Close() }()
		f := &frameLimiter{Conn: client, max: 1000, maxMsg: maxMsg}
		got, err := io.ReadAll(f)
		switch {
		case !more && (err != nil || len(got) != len(stream(more))):
			t.Fatalf("separate messages: read %d bytes, %v", len(got), err)
		case more && !errors.Is(err, errFrameTooLarge):
			t.Fatalf("one message of %d frames: %v, want errFrameTooLarge", frames, err)
		}
	}
}

func TestBoundedEndpoint(t *testing.T) {
	if got := bounded("tcp://10.0.0.1:5557"); got != boundedNetwork+"://10.0.0.1:5557" {
		t.Errorf("tcp endpoint: %q", got)
	}
	if got := bounded("ipc:///tmp/kv"); got != "ipc:///tmp/kv" {
		t.Errorf("ipc endpoint: %q", got)
	}
}
