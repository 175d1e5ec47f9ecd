package trace

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// AzureTimeLayout is the time.Parse layout of the Azure trace TIMESTAMP
// column: wall-clock time without a zone, 7 fractional digits (100 ns), e.g.
// "2023-11-16 18:17:03.9799600" (shared/data/traces/README.md §3).
const AzureTimeLayout = "2006-01-02 15:04:05.0000000"

// azureHeader is the exact header of AzureLLMInferenceTrace_{code,conv}.csv.
var azureHeader = [3]string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// ReadAzure parses an Azure LLM inference trace (Azure/AzurePublicDataset
// data/AzureLLMInferenceTrace_*.csv, 2023): the header
// "TIMESTAMP,ContextTokens,GeneratedTokens" then one request per line. Lines
// may end in CRLF or LF and the last may lack a newline (as in the real
// files); encoding/csv skips empty lines. TIMESTAMP is parsed with
// AzureTimeLayout and Arrival is its offset from the first request's
// timestamp. ContextTokens becomes InputLength and GeneratedTokens
// OutputLength; HashIDs is nil.
//
// Each of these is a *ParseError naming the line: a missing or different
// header, a record without exactly 3 fields, CSV syntax errors, an
// unparsable timestamp, a non-integer or negative token count
// (ErrNegative), a timestamp earlier than the previous one
// (ErrTimestampDecreased), or one so far after the first that its offset
// does not fit a time.Duration (ErrDurationOverflow; time.Time.Sub would
// saturate instead). An empty input is a *ParseError too (no header); an
// input with only the header is an error wrapping ErrNoRecords,
// "NAME: no records". So is a line over MaxLineBytes (ErrLineTooLong) and
// an input that starts with a JSON object (a *FormatError: JSON lines), and
// one that starts with a compressed stream (a *CompressedError).
func ReadAzure(r io.Reader, name string) ([]Record, error) {
	return collect(func(yield func(*Record) bool) error { return scanAzure(r, name, yield) })
}

// scanAzure parses an Azure trace as ReadAzure does, handing each record
// to yield as soon as its line is read, and stops early, with a nil error,
// when yield returns false. The record is yield's to keep.
func scanAzure(r io.Reader, name string, yield func(*Record) bool) error {
	lr := &lineLimiter{r: r, line: 1}
	br := bufio.NewReader(lr)
	if err := compressed(br); err != nil {
		return &ParseError{File: name, Line: 1, Err: err}
	}
	if looksLikeJSON(br) {
		return &ParseError{File: name, Line: 1, Err: &FormatError{Read: Azure, Looks: Mooncake}}
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = len(azureHeader)
	cr.ReuseRecord = true
	wrap := func(line int, err error) error {
		var pe *csv.ParseError
		switch {
		case errors.As(err, &pe) && errors.Is(pe.Err, csv.ErrFieldCount):
			return &ParseError{File: name, Line: pe.Line, Err: fmt.Errorf("%w: want %d, %s", pe.Err, len(azureHeader), strings.Join(azureHeader[:], ","))}
		case errors.As(err, &pe):
			return &ParseError{File: name, Line: pe.Line, Err: pe.Err}
		case errors.Is(err, ErrLineTooLong):
			return &ParseError{File: name, Line: lr.line, Err: err}
		}
		return &ParseError{File: name, Line: line, Err: err}
	}
	hdr, err := cr.Read()
	if err == io.EOF {
		return &ParseError{File: name, Line: 1, Err: errors.New("empty file: missing header")}
	}
	if err != nil {
		return wrap(1, err)
	}
	if line, _ := cr.FieldPos(0); [3]string(hdr) != azureHeader {
		return &ParseError{File: name, Line: line,
			Err: fmt.Errorf("header %q, want %q", hdr, azureHeader[:])}
	}
	var (
		n     int // records read
		first time.Time
		prev  time.Time
	)
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			if n == 0 {
				return fmt.Errorf("%s: %w", name, ErrNoRecords)
			}
			return nil
		}
		if err != nil {
			line, _ := cr.FieldPos(0)
			return wrap(line, err)
		}
		line, _ := cr.FieldPos(0)
		t, err := time.Parse(AzureTimeLayout, rec[0])
		if err != nil {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("TIMESTAMP %q: want a time such as 2023-11-16 18:17:03.9799600 (7 fractional digits)", rec[0])}
		}
		in, err := tokenCount("ContextTokens", rec[1])
		if err != nil {
			return &ParseError{File: name, Line: line, Err: err}
		}
		out, err := tokenCount("GeneratedTokens", rec[2])
		if err != nil {
			return &ParseError{File: name, Line: line, Err: err}
		}
		if n == 0 {
			first, prev = t, t
		}
		if t.Before(prev) {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: %s after %s", ErrTimestampDecreased, rec[0], prev.Format(AzureTimeLayout))}
		}
		prev = t
		// Sub saturates at the largest Duration; adding it back detects that.
		arrival := t.Sub(first)
		if !first.Add(arrival).Equal(t) {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("TIMESTAMP %s is too far after the first request's %s: the offset %w",
					rec[0], first.Format(AzureTimeLayout), ErrDurationOverflow)}
		}
		record := Record{
			Index:        n,
			Line:         line,
			Arrival:      arrival,
			InputLength:  in,
			OutputLength: out,
		}
		n++
		if !yield(&record) {
			return nil
		}
	}
}

// tokenCount parses the token count s of column field, with a message
// in words when it is not a non-negative integer that fits an int.
func tokenCount(field, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		if s == "" {
			return 0, fmt.Errorf("%s: empty, want an integer", field)
		}
		return 0, fmt.Errorf("%s: %w", field, notCount(s))
	}
	if n < 0 {
		return 0, fmt.Errorf("%s: %w (%d)", field, ErrNegative, n)
	}
	return n, nil
}

// looksLikeJSON reports whether the input, past leading white space, starts
// with a JSON object: a Mooncake JSONL trace read as CSV. It peeks and
// consumes nothing.
func looksLikeJSON(br *bufio.Reader) bool {
	b, _ := br.Peek(512)
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

// lineLimiter passes r through until a line (the bytes up to a '\n')
// reaches MaxLineBytes, then fails with lineTooLong: encoding/csv buffers a
// whole line, however long. line is the 1-based number of the line being
// read.
type lineLimiter struct {
	r    io.Reader
	line int
	cur  int // bytes of the current line read so far
}

func (l *lineLimiter) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for b := p[:n]; ; {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			l.cur += len(b)
			break
		}
		if l.cur+i > MaxLineBytes {
			return 0, lineTooLong()
		}
		l.cur = 0
		l.line++
		b = b[i+1:]
	}
	if l.cur > MaxLineBytes {
		return 0, lineTooLong()
	}
	return n, err
}
