package trace

import (
	"bytes"
	"io"
	"iter"
	"path/filepath"
	"strings"

	"github.com/switchyard-router/switchyard/router/trace/bundled"
)

// DefaultHold is the most requests of a trace file router replay holds in
// memory after Open has checked it (about 20 MB of Mooncake records), so
// that a trace of that size, such as the bundled one, is parsed once; a
// longer one is read again, as a stream, by each run.
const DefaultHold = 1 << 16

// Opened is a trace opened for replay by Open, read once to check it. A
// trace of at most hold requests (Open's argument), and one from standard
// input (which cannot be read twice), is then held in Records; a longer
// trace file is in Stream instead, read again by each run, so that it is
// never held whole. Exactly one of Records and Stream is set.
type Opened struct {
	// Name is the trace's name for the table: the file's base name,
	// "stdin", or bundled.Name + " (bundled)".
	Name string
	// Records are the requests to replay, when held; else nil.
	Records []Record
	// Stream yields the requests to replay (the limit applied), when not
	// held; else nil.
	Stream iter.Seq2[*Record, error]
	// Requests is the number of requests to replay (the limit applied).
	Requests int
	// Hashes reports whether some request replayed has prefix hashes.
	Hashes bool
	// Source is the trace family, as the last record replayed says.
	Source Source
	// Failed counts the requests replayed that failed when the trace was
	// recorded (Record.FailedInRecording).
	Failed int
}

// Open opens the trace at path for replay: in format f (by path's
// extension, FormatOf, when f is empty), stdin when path is "-" (f is then
// required), or the bundled conversation trace (package bundled) when
// path is empty. It reads the trace through and checks every line: limit
// > 0 keeps only the first limit requests (every line is checked all the
// same), and up to hold of them are held in memory (see Opened; DefaultHold
// is router replay's). Errors: the first read or parse error (a
// *ParseError, a *FormatError, a *CompressedError, ErrUnknownFormat,
// ErrNoRecords, inputfile.ErrNotRegular...), unchanged so that a caller
// can say what to do. A file that changes between this check and a run's
// reading fails or replays what it then holds.
func Open(path string, f Format, stdin io.Reader, limit, hold int) (*Opened, error) {
	tr := &Opened{Name: filepath.Base(path)}
	var err error
	switch {
	case path == "":
		var b []byte
		if b, err = bundled.ConversationTrace(); err != nil {
			return nil, err
		}
		tr.Name = bundled.Name + " (bundled)"
		tr.Stream = func(yield func(*Record, error) bool) {
			for rec, err := range Records(bytes.NewReader(b), bundled.Name, Mooncake) {
				if !yield(rec, err) {
					return
				}
			}
		}
	case path == "-":
		tr.Name = "stdin"
		tr.Records, err = ReadAs(stdin, tr.Name, f)
	case f != "":
		tr.Stream = FileRecords(path, f)
	default:
		tr.Stream = FileRecords(path, FormatOf(path))
	}
	if tr.Stream != nil {
		if err = tr.check(limit, hold); tr.Records != nil {
			tr.Stream = nil
		} else {
			tr.Stream = limited(tr.Stream, limit)
		}
	} else if err == nil {
		if limit > 0 && limit < len(tr.Records) {
			tr.Records = tr.Records[:limit]
		}
		tr.Requests = len(tr.Records)
		for i := range tr.Records {
			tr.note(&tr.Records[i])
		}
	}
	if err != nil {
		return nil, err
	}
	return tr, nil
}

// check reads tr.Stream through: it returns the first error, and counts
// the requests among the first limit (all when limit <= 0), notes them
// and, when they are at most hold, keeps them in tr.Records.
func (tr *Opened) check(limit, hold int) error {
	for rec, err := range tr.Stream {
		if err != nil {
			tr.Records = nil
			return err
		}
		if limit <= 0 || tr.Requests < limit {
			tr.Requests++
			tr.note(rec)
			if tr.Requests <= hold {
				tr.Records = append(tr.Records, *rec)
			} else {
				tr.Records = nil
			}
		}
	}
	return nil
}

// note counts rec, a request replayed, into tr's prefix hashes, family
// and failed requests.
func (tr *Opened) note(rec *Record) {
	tr.Hashes = tr.Hashes || len(rec.HashIDs) > 0
	tr.Source = rec.Source
	if rec.FailedInRecording() {
		tr.Failed++
	}
}

// FailedInRecording reports whether r is a request that failed when the
// trace was recorded: in a BurstGPT trace, one with Response tokens 0
// (HPMLL/BurstGPT README: BurstGPT_*.csv holds "some failure that
// Response tokens are 0s"; BurstGPT_without_fails_*.csv drops them).
// Replay keeps such a request, as one that generates no token: it arrived
// and was routed, and dropping it would change the arrivals.
func (r *Record) FailedInRecording() bool {
	return r.Source == SourceBurstGPT && r.OutputLength == 0
}

// limited is seq's first limit records (all of them when limit <= 0).
func limited(seq iter.Seq2[*Record, error], limit int) iter.Seq2[*Record, error] {
	if limit <= 0 {
		return seq
	}
	return func(yield func(*Record, error) bool) {
		n := 0
		for rec, err := range seq {
			if n == limit || !yield(rec, err) {
				return
			}
			n++
		}
	}
}

// CompressionOf returns the compression path's extension names
// (t.jsonl.gz: gzip), or nil.
func CompressionOf(path string) *Compression {
	ext := strings.ToLower(filepath.Ext(path))
	for i, c := range Compressions {
		if c.Ext == ext {
			return &Compressions[i]
		}
	}
	return nil
}
