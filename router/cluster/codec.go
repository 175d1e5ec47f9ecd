package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/switchyard-router/switchyard/shared"
)

// The wire format of a deltas message (one NATS message, one or more
// records), version 2:
//
//	message  = version:byte record*
//	record   = kind:byte body
//	booked   = at:uvarint id:str worker:str model:str role:byte
//	           prompt_tokens:uvarint block_size:uvarint
//	           hashes:uvarint hash:uint64le* rank:uvarint
//	first    = id:str
//	released = id:str
//	reset    = (empty)
//	str      = len:uvarint bytes
//
// at is the decision's wall time in Unix nanoseconds (the sync lag's
// start). Every length is bounded (maxString, maxHashes): a record over a
// bound makes the whole message malformed, and decoding is linear in the
// message's size. Version 1 is version 2 without the booking's
// data-parallel rank (its booking lands on the worker's lowest rank); it
// is still read, so replicas can be upgraded one at a time, but a version
// 1 replica drops version 2 messages as malformed.
const (
	wireVersion   = 2
	wireVersionV1 = 1
)

// Kind is a record's kind.
type Kind byte

// Record kinds.
const (
	// KindBooked: a replica placed a request on a worker.
	KindBooked Kind = 1
	// KindFirstToken: the request's prefill is done.
	KindFirstToken Kind = 2
	// KindReleased: the request's booking is released.
	KindReleased Kind = 3
	// KindReset: forget every booking of the sending replica; the records
	// after it are its live bookings (a snapshot), then its deltas again.
	KindReset Kind = 4
)

// Bounds of a decoded record.
const (
	maxString = 512
	// maxHashes bounds the block hashes of one booking: 65,536 blocks of
	// 16 tokens are a 1M-token prompt.
	maxHashes = 1 << 16
	// maxMessage is the most bytes one deltas message takes (NATS's
	// default max_payload is 1 MiB).
	maxMessage = 1 << 20
)

// errMalformed: a message that does not decode.
var errMalformed = errors.New("malformed deltas message")

// Record is one delta.
type Record struct {
	Kind Kind
	// ID is the request's id in the sending replica.
	ID string
	// The booking (KindBooked): when it was decided (Unix nanoseconds),
	// the worker's name, the request's model, role, prompt tokens, block
	// size and block hashes.
	At           int64
	Worker       string
	Model        string
	Role         shared.Role
	PromptTokens int
	BlockSize    int
	BlockHashes  []uint64
	// Rank is the worker's data-parallel rank booked, when HasRank (a
	// version 2 message; version 1 carried none).
	Rank    uint32
	HasRank bool
}

var roleCodes = map[shared.Role]byte{shared.RoleAggregated: 0, shared.RolePrefill: 1, shared.RoleDecode: 2}
var codeRoles = []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode}

// size returns an upper bound of rec's encoded size.
func (rec *Record) size() int {
	return 1 + 3*binary.MaxVarintLen64 + 3*(binary.MaxVarintLen64+maxString) + 1 + 2*binary.MaxVarintLen64 + 8*len(rec.BlockHashes)
}

func appendString(b []byte, s string) []byte {
	if len(s) > maxString {
		s = s[:maxString]
	}
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendRecord appends rec's encoding to b.
func appendRecord(b []byte, rec *Record) []byte {
	b = append(b, byte(rec.Kind))
	switch rec.Kind {
	case KindBooked:
		b = binary.AppendUvarint(b, uint64(max(rec.At, 0)))
		b = appendString(b, rec.ID)
		b = appendString(b, rec.Worker)
		b = appendString(b, rec.Model)
		b = append(b, roleCodes[rec.Role])
		b = binary.AppendUvarint(b, uint64(max(rec.PromptTokens, 0)))
		b = binary.AppendUvarint(b, uint64(max(rec.BlockSize, 0)))
		hs := rec.BlockHashes[:min(len(rec.BlockHashes), maxHashes)]
		b = binary.AppendUvarint(b, uint64(len(hs)))
		for _, h := range hs {
			b = binary.LittleEndian.AppendUint64(b, h)
		}
		b = binary.AppendUvarint(b, uint64(rec.Rank))
	case KindFirstToken, KindReleased:
		b = appendString(b, rec.ID)
	}
	return b
}

// decoder reads one message.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errMalformed, what)
	}
}

func (d *decoder) uvarint(what string, limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) str(what string) string {
	n := d.uvarint(what, maxString)
	if d.err != nil {
		return ""
	}
	if uint64(len(d.b)) < n {
		d.fail(what)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// decode calls fn for each record of msg, in order; the record (and its
// BlockHashes) is only valid during the call. Errors: errMalformed
// (wrapped, naming what) for a message that is not version 1 or 2, is longer
// than maxMessage, or has a record that does not decode or passes a bound;
// the records before it were delivered.
func decode(msg []byte, fn func(*Record)) error {
	if len(msg) > maxMessage {
		return fmt.Errorf("%w: %d bytes", errMalformed, len(msg))
	}
	d := decoder{b: msg}
	v := d.byte1("version")
	if d.err == nil && v != wireVersion && v != wireVersionV1 {
		return fmt.Errorf("%w: version %d", errMalformed, v)
	}
	var rec Record
	var hashes []uint64
	for d.err == nil && len(d.b) > 0 {
		rec = Record{Kind: Kind(d.byte1("kind"))}
		switch rec.Kind {
		case KindBooked:
			rec.At = int64(d.uvarint("decision time", 1<<62))
			rec.ID = d.str("id")
			rec.Worker = d.str("worker")
			rec.Model = d.str("model")
			role := d.byte1("role")
			if int(role) >= len(codeRoles) {
				d.fail("role")
				break
			}
			rec.Role = codeRoles[role]
			rec.PromptTokens = int(d.uvarint("prompt tokens", 1<<40))
			rec.BlockSize = int(d.uvarint("block size", 1<<20))
			n := d.uvarint("block hashes", maxHashes)
			if d.err != nil || uint64(len(d.b)) < 8*n {
				d.fail("block hashes")
				break
			}
			hashes = hashes[:0]
			for i := range n {
				hashes = append(hashes, binary.LittleEndian.Uint64(d.b[8*i:]))
			}
			d.b = d.b[8*n:]
			rec.BlockHashes = hashes
			if v == wireVersion {
				rec.Rank, rec.HasRank = uint32(d.uvarint("rank", 1<<20)), true
			}
		case KindFirstToken, KindReleased:
			rec.ID = d.str("id")
		case KindReset:
		default:
			d.fail(fmt.Sprintf("kind %d", rec.Kind))
		}
		if d.err == nil {
			fn(&rec)
		}
	}
	return d.err
}
