package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// maxMillis is the largest timestamp (ms) whose Duration does not overflow.
const maxMillis = math.MaxInt64 / int64(time.Millisecond)

// ReadMooncake parses a Mooncake JSONL trace: one object per line with
// exactly the fields
//
//	{"timestamp": int ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}
//
// in any order (kvcache-ai/Mooncake FAST25-release; shared/data/traces/README.md),
// or, in place of input_length and hash_ids, a request's prompt: a
// Responses request ("input", "instructions") or an Anthropic Messages
// request ("system", "messages"), rendered as router/live keys it (see
// decodePromptLine's file, prompt.go).
// Lines are decoded with encoding/json, so field names match
// case-insensitively ("Timestamp" is "timestamp") and, when a field is
// repeated, the last value wins. Each of these is an error, reported as a
// *ParseError naming the line: invalid JSON, trailing data after the
// object, an unknown, missing or null field, a value that is not an integer
// (a float, a string, ...), a negative number (ErrNegative), a number out of
// range, a timestamp that decreases (ErrTimestampDecreased), or
// len(hash_ids) != ceil(input_length/512) (ErrHashIDCount), a line over
// MaxLineBytes (ErrLineTooLong), and a first line that is CSV rather than
// JSON (a *FormatError) or is a compressed stream (a *CompressedError). Blank lines are allowed only at the end of the
// input. Arrival is the timestamp minus the
// first line's timestamp. name is used in error messages only.
//
// An input with no records (empty, or only blank lines) is an error
// wrapping ErrNoRecords, "NAME: no records".
func ReadMooncake(r io.Reader, name string) ([]Record, error) {
	return collect(func(yield func(*Record) bool) error { return scanMooncake(r, name, yield) })
}

// scanMooncake parses a Mooncake trace as ReadMooncake does, handing each
// record to yield as soon as its line is read, and stops early, with a nil
// error, when yield returns false. The record is yield's to keep.
func scanMooncake(r io.Reader, name string, yield func(*Record) bool) error {
	br := bufio.NewReader(r)
	if err := compressed(br); err != nil {
		return &ParseError{File: name, Line: 1, Err: err}
	}
	skipBOM(br)
	sc := bufio.NewScanner(br)
	// The buffer holds a line and its newline.
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes+1)
	var (
		n         int // records read
		line      int
		blankLine int // first blank line not yet followed by content
		first     int64
		prev      int64
	)
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			if blankLine == 0 {
				blankLine = line
			}
			continue
		}
		if blankLine != 0 {
			return &ParseError{File: name, Line: blankLine, Err: errors.New("blank line before the end of the trace")}
		}
		var (
			l   *mooncakeLine
			err error
		)
		if carries, responses := promptShape(b); carries {
			l, err = decodePromptLine(b, responses)
		} else {
			l, err = decodeMooncakeLine(b)
		}
		if err != nil {
			if n == 0 && looksLikeCSV(b) {
				err = &FormatError{Read: Mooncake, Looks: Azure}
			}
			return &ParseError{File: name, Line: line, Err: err}
		}
		ts, in, out := *l.Timestamp, *l.InputLength, *l.OutputLength
		if n == 0 {
			first, prev = ts, ts
		}
		if ts < prev {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: %d ms after %d ms", ErrTimestampDecreased, ts, prev)}
		}
		prev = ts
		ids := *l.HashIDs
		if want := ceilDiv(in, MooncakeBlockTokens); int64(len(ids)) != want {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: %d ids for input_length %d, want %d", ErrHashIDCount, len(ids), in, want)}
		}
		if in > math.MaxInt || out > math.MaxInt {
			return &ParseError{File: name, Line: line, Err: errors.New("length overflows int")}
		}
		var hashIDs []uint64
		if len(ids) > 0 {
			hashIDs = make([]uint64, len(ids))
			for i, id := range ids {
				hashIDs[i] = uint64(id)
			}
		}
		rec := Record{
			Index:        n,
			Line:         line,
			Arrival:      time.Duration(ts-first) * time.Millisecond,
			InputLength:  int(in),
			OutputLength: int(out),
			HashIDs:      hashIDs,
			Source:       SourceMooncake,
		}
		if l.Priority != nil {
			if *l.Priority < math.MinInt32 || *l.Priority > math.MaxInt32 {
				return &ParseError{File: name, Line: line, Err: fmt.Errorf("priority %d out of range", *l.Priority)}
			}
			rec.Priority, rec.HasPriority = int(*l.Priority), true
		}
		if l.PolicyClass != nil {
			rec.PolicyClass = *l.PolicyClass
		}
		if l.SessionID != nil {
			rec.SessionID = *l.SessionID
		}
		n++
		if !yield(&rec) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = lineTooLong()
		}
		return &ParseError{File: name, Line: line + 1, Err: err}
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", name, ErrNoRecords)
	}
	return nil
}

func ceilDiv(a, b int64) int64 { return a/b + min(a%b, 1) }

// looksLikeCSV reports whether the first line of a would-be JSONL trace,
// which did not decode, is rather a CSV line: it has commas (the Azure
// header is "TIMESTAMP,ContextTokens,GeneratedTokens") and is no JSON
// value, nor starts like a JSON object or array ([1,2] is JSON, and its
// error says it is an array, not an object).
func looksLikeCSV(line []byte) bool {
	line = bytes.TrimSpace(line)
	return !bytes.HasPrefix(line, []byte("{")) && !bytes.HasPrefix(line, []byte("[")) &&
		bytes.Contains(line, []byte(",")) && !json.Valid(line)
}

// mooncakeLine is one trace line. The fields are pointers so that a missing
// field and a null one (which encoding/json leaves nil) are detected.
type mooncakeLine struct {
	Timestamp    *int64    `json:"timestamp"`
	InputLength  *int64    `json:"input_length"`
	OutputLength *int64    `json:"output_length"`
	HashIDs      *[]hashID `json:"hash_ids"`
	// Optional request attributes, for classifiers (not in the published
	// traces; a generated trace may carry them).
	Priority    *int64  `json:"priority"`
	PolicyClass *string `json:"policy_class"`
	SessionID   *string `json:"session_id"`
}

// hashID is one element of hash_ids. It has its own UnmarshalJSON because
// encoding/json silently ignores a null array element (leaving 0) and words
// a negative or fractional id as a type mismatch; this rejects null and
// reports negatives as ErrNegative.
type hashID uint64

func (h *hashID) UnmarshalJSON(b []byte) error {
	v, err := parseCount(b)
	if err != nil {
		return fmt.Errorf("hash_ids: %w", err)
	}
	*h = hashID(v)
	return nil
}

// parseCount parses a JSON literal as a non-negative integer up to
// math.MaxUint64, with a message saying what is wrong otherwise.
func parseCount(b []byte) (uint64, error) {
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err == nil || string(b) == "-0" {
		return v, nil
	}
	return 0, notCount(string(b))
}

// notCount explains why the JSON literal s is not a non-negative integer
// that fits its Go type.
func notCount(s string) error {
	switch {
	case s == "null":
		return errors.New("null, want an integer")
	case s == "true" || s == "false":
		return fmt.Errorf("%s, want an integer", s)
	case strings.HasPrefix(s, `"`):
		return fmt.Errorf("string %s, want an integer", s)
	case strings.HasPrefix(s, "-") && s != "-0":
		return fmt.Errorf("%w (%s)", ErrNegative, s)
	case strings.Trim(s, "0123456789") == "":
		return fmt.Errorf("value %s out of range", s)
	default:
		return fmt.Errorf("%s is not an integer", s)
	}
}

// decodeMooncakeLine decodes one non-blank line into a mooncakeLine whose
// fields are all set, with a non-negative timestamp and lengths.
func decodeMooncakeLine(b []byte) (*mooncakeLine, error) {
	var l mooncakeLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, decodeError(err)
	}
	off := int(dec.InputOffset())
	if rest := bytes.TrimLeft(b[off:], " \t\r\n"); len(rest) > 0 { // JSON whitespace only
		return nil, fmt.Errorf("invalid JSON: trailing data after the object at column %d", len(b)-len(rest)+1)
	}
	for _, f := range [...]struct {
		name string
		v    *int64
	}{{"timestamp", l.Timestamp}, {"input_length", l.InputLength}, {"output_length", l.OutputLength}} {
		switch {
		case f.v == nil:
			return nil, fmt.Errorf("missing or null field %q", f.name)
		case *f.v < 0:
			return nil, fmt.Errorf("%s: %w (%d)", f.name, ErrNegative, *f.v)
		}
	}
	if l.HashIDs == nil {
		return nil, errors.New(`missing or null field "hash_ids"`)
	}
	if *l.Timestamp > maxMillis {
		return nil, fmt.Errorf("timestamp %d ms %w", *l.Timestamp, ErrDurationOverflow)
	}
	return &l, nil
}

// decodeError words an encoding/json error for a trace line, keeping the
// original as the cause where it has a useful type.
func decodeError(err error) error {
	var (
		te *json.UnmarshalTypeError
		se *json.SyntaxError
	)
	switch {
	case errors.As(err, &te):
		// Value is "number 1.5", "number -3", "string", "bool", "array", ...
		field := te.Field
		if field == "" {
			kind := te.Value // array, string, number, bool
			if kind == "bool" {
				kind = "boolean"
			}
			return fmt.Errorf("the line is a JSON %s, not an object", kind)
		}
		if te.Type != nil && te.Type.Kind() == reflect.String { // policy_class, session_id
			return fmt.Errorf("%s: %s, want a string", field, te.Value)
		}
		if num, ok := strings.CutPrefix(te.Value, "number "); ok {
			return fmt.Errorf("%s: %w", field, notCount(num))
		}
		if field == "hash_ids" {
			return fmt.Errorf("%s: %s, want an array of integers", field, te.Value)
		}
		return fmt.Errorf("%s: %s, want an integer", field, te.Value)
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at column %d: %w", se.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("invalid JSON: unexpected end of line")
	default:
		// json: unknown field "x", or an error from hashID.UnmarshalJSON.
		if s, ok := strings.CutPrefix(err.Error(), "json: "); ok {
			return errors.New(s)
		}
		return err
	}
}
