package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// maxMooncakeLine bounds one JSONL line. The longest real line (a
// 126,195-token prompt, 247 ids) is about 2 KB; 16 MiB leaves room for any
// prompt that fits a 64-bit token count while still rejecting garbage.
const maxMooncakeLine = 16 << 20

// maxMillis is the largest timestamp (ms) whose Duration does not overflow.
const maxMillis = math.MaxInt64 / int64(time.Millisecond)

// ReadMooncake parses a Mooncake JSONL trace: one object per line with
// exactly the fields
//
//	{"timestamp": int ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}
//
// in any order (kvcache-ai/Mooncake FAST25-release; shared/data/traces/README.md).
// Field names are matched exactly (case-sensitive). Each of these is an error,
// reported as a *ParseError naming the line: invalid JSON, an unknown,
// duplicate, missing or null field, a non-integer or negative number, a
// timestamp that decreases (ErrTimestampDecreased), or
// len(hash_ids) != ceil(input_length/512) (ErrHashIDCount). Blank lines are
// allowed only at the end of the input. Arrival is the timestamp minus the
// first line's timestamp. name is used in error messages only.
//
// An empty input yields no records and no error.
func ReadMooncake(r io.Reader, name string) ([]Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxMooncakeLine)
	var (
		recs      []Record
		line      int
		blankLine int // first blank line not yet followed by content
		first     int64
		prev      int64
		p         mooncakeParser
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
			return nil, &ParseError{File: name, Line: blankLine, Err: errors.New("blank line before the end of the trace")}
		}
		f, err := p.parse(b)
		if err != nil {
			return nil, &ParseError{File: name, Line: line, Err: err}
		}
		if len(recs) == 0 {
			first, prev = f.timestamp, f.timestamp
		}
		if f.timestamp < prev {
			return nil, &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: %d ms after %d ms", ErrTimestampDecreased, f.timestamp, prev)}
		}
		prev = f.timestamp
		if want := ceilDiv(f.inputLength, MooncakeBlockTokens); int64(len(p.ids)) != want {
			return nil, &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: %d ids for input_length %d, want %d", ErrHashIDCount, len(p.ids), f.inputLength, want)}
		}
		if f.inputLength > math.MaxInt || f.outputLength > math.MaxInt {
			return nil, &ParseError{File: name, Line: line, Err: errors.New("length overflows int")}
		}
		var ids []uint64
		if len(p.ids) > 0 {
			ids = make([]uint64, len(p.ids))
			copy(ids, p.ids)
		}
		recs = append(recs, Record{
			Index:        len(recs),
			Line:         line,
			Arrival:      time.Duration(f.timestamp-first) * time.Millisecond,
			InputLength:  int(f.inputLength),
			OutputLength: int(f.outputLength),
			HashIDs:      ids,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, &ParseError{File: name, Line: line + 1, Err: err}
	}
	return recs, nil
}

func ceilDiv(a, b int64) int64 { return a/b + min(a%b, 1) }

// mooncakeFields is one parsed line.
type mooncakeFields struct {
	timestamp, inputLength, outputLength int64
}

// mooncakeParser is a strict parser for the flat Mooncake line object. It is
// hand-written rather than encoding/json because encoding/json matches field
// names case-insensitively, silently accepts duplicate keys and floats such
// as 1.5 into a float, and is several times slower on 3 MB traces.
type mooncakeParser struct {
	b   []byte
	i   int
	ids []uint64 // hash_ids of the last parsed line; reused
}

const (
	fTimestamp = 1 << iota
	fInput
	fOutput
	fHashIDs
	fAll = fTimestamp | fInput | fOutput | fHashIDs
)

var fieldNames = [...]string{"timestamp", "input_length", "output_length", "hash_ids"}

func (p *mooncakeParser) parse(b []byte) (mooncakeFields, error) {
	p.b, p.i, p.ids = b, 0, p.ids[:0]
	var f mooncakeFields
	seen := 0
	p.ws()
	if err := p.expect('{'); err != nil {
		return f, err
	}
	p.ws()
	if p.peek() == '}' {
		p.i++
	} else {
		for {
			p.ws()
			key, err := p.key()
			if err != nil {
				return f, err
			}
			p.ws()
			if err := p.expect(':'); err != nil {
				return f, err
			}
			p.ws()
			var bit int
			switch key {
			case "timestamp":
				bit = fTimestamp
				f.timestamp, err = p.nonNeg(key)
				if err == nil && f.timestamp > maxMillis {
					err = fmt.Errorf("timestamp %d ms overflows a time.Duration", f.timestamp)
				}
			case "input_length":
				bit = fInput
				f.inputLength, err = p.nonNeg(key)
			case "output_length":
				bit = fOutput
				f.outputLength, err = p.nonNeg(key)
			case "hash_ids":
				bit = fHashIDs
				err = p.idArray()
			default:
				return f, fmt.Errorf("unknown field %q", key)
			}
			if err != nil {
				return f, err
			}
			if seen&bit != 0 {
				return f, fmt.Errorf("duplicate field %q", key)
			}
			seen |= bit
			p.ws()
			c := p.peek()
			if p.i >= len(p.b) || (c != ',' && c != '}') {
				return f, p.syntax("',' or '}'")
			}
			p.i++
			if c == '}' {
				break
			}
		}
	}
	p.ws()
	if p.i < len(p.b) {
		return f, fmt.Errorf("invalid JSON: trailing data after the object at column %d", p.i+1)
	}
	if seen != fAll {
		for k, name := range fieldNames {
			if seen&(1<<k) == 0 {
				return f, fmt.Errorf("missing field %q", name)
			}
		}
	}
	return f, nil
}

func (p *mooncakeParser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *mooncakeParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\r', '\n':
			p.i++
		default:
			return
		}
	}
}

func (p *mooncakeParser) syntax(want string) error {
	if p.i >= len(p.b) {
		return fmt.Errorf("invalid JSON: unexpected end of line, want %s", want)
	}
	return fmt.Errorf("invalid JSON: unexpected %q at column %d, want %s", p.b[p.i], p.i+1, want)
}

func (p *mooncakeParser) expect(c byte) error {
	if p.peek() != c || p.i >= len(p.b) {
		return p.syntax(fmt.Sprintf("%q", c))
	}
	p.i++
	return nil
}

// key parses a JSON string. Keys without escapes (all real ones) are
// returned without copying the bytes beyond the string conversion; escaped
// keys are decoded by encoding/json so "\u0074imestamp" is "timestamp".
func (p *mooncakeParser) key() (string, error) {
	if p.peek() != '"' {
		return "", p.syntax("a field name")
	}
	start := p.i
	p.i++
	escaped := false
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '\\':
			escaped = true
			p.i += 2
			continue
		case c == '"':
			p.i++
			raw := p.b[start:p.i]
			if !escaped {
				return string(raw[1 : len(raw)-1]), nil
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("invalid JSON: field name %s: %v", raw, err)
			}
			return s, nil
		case c < 0x20:
			return "", fmt.Errorf("invalid JSON: control character in field name at column %d", p.i+1)
		}
		p.i++
	}
	return "", errors.New("invalid JSON: unterminated field name")
}

// number parses a JSON integer (optional '-', no leading zeros) and reports
// whether it was negative. Fractions, exponents and out-of-range values are
// errors.
func (p *mooncakeParser) number(what string) (mag uint64, neg bool, err error) {
	if p.peek() == '-' {
		neg = true
		p.i++
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if mag > (math.MaxUint64-d)/10 {
			return 0, neg, fmt.Errorf("%s: value out of range", what)
		}
		mag = mag*10 + d
		p.i++
	}
	n := p.i - start
	switch {
	case n == 0:
		if p.i < len(p.b) && p.b[p.i] == 'n' {
			return 0, neg, fmt.Errorf("%s: null, want an integer", what)
		}
		return 0, neg, fmt.Errorf("%s: %w", what, p.syntax("an integer"))
	case n > 1 && p.b[start] == '0':
		return 0, neg, fmt.Errorf("%s: invalid JSON: leading zero", what)
	}
	if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, neg, fmt.Errorf("%s: not an integer", what)
	}
	return mag, neg, nil
}

func (p *mooncakeParser) nonNeg(what string) (int64, error) {
	mag, neg, err := p.number(what)
	switch {
	case err != nil:
		return 0, err
	case neg && mag != 0:
		return 0, fmt.Errorf("%s: %w (-%d)", what, ErrNegative, mag)
	case mag > math.MaxInt64:
		return 0, fmt.Errorf("%s: value out of range", what)
	}
	return int64(mag), nil
}

func (p *mooncakeParser) idArray() error {
	if p.peek() != '[' {
		if p.peek() == 'n' {
			return errors.New("hash_ids: null, want an array")
		}
		return fmt.Errorf("hash_ids: %w", p.syntax("'['"))
	}
	p.i++
	p.ws()
	if p.peek() == ']' {
		p.i++
		return nil
	}
	for {
		p.ws()
		mag, neg, err := p.number("hash_ids")
		if err != nil {
			return err
		}
		if neg && mag != 0 {
			return fmt.Errorf("hash_ids[%d]: %w (-%d)", len(p.ids), ErrNegative, mag)
		}
		p.ids = append(p.ids, mag)
		p.ws()
		c := p.peek()
		if p.i >= len(p.b) || (c != ',' && c != ']') {
			return fmt.Errorf("hash_ids: %w", p.syntax("',' or ']'"))
		}
		p.i++
		if c == ']' {
			return nil
		}
	}
}
