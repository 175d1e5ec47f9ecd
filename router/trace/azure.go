package trace

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AzureTimeLayout is the time.Parse layout of the Azure trace TIMESTAMP
// column: wall-clock time without a zone, 7 fractional digits (100 ns), e.g.
// "2023-11-16 18:17:03.9799600" (shared/data/traces/README.md §3).
const AzureTimeLayout = "2006-01-02 15:04:05.0000000"

// Azure2024TimeLayout is the time.Parse layout of the TIMESTAMP column of
// the Azure 2024 week-long traces (AzureLLMInferenceTrace_{code,conv}_1week.csv):
// UTC with its offset and up to 6 fractional digits, which the files omit
// when they are all zero, e.g. "2024-05-10 00:00:00.009930+00:00" and
// "2024-05-12 00:00:00+00:00" (analysis/AzureLLMInferenceDataset2024.ipynb
// in Azure/AzurePublicDataset; time.Parse accepts a fraction the layout
// does not show).
const Azure2024TimeLayout = "2006-01-02 15:04:05-07:00"

// azureHeader is the exact header of the Azure traces, 2023
// (AzureLLMInferenceTrace_{code,conv}.csv) and 2024 (the *_1week.csv files)
// alike.
var azureHeader = [3]string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// ReadAzure parses a CSV trace, choosing the reader by its header line:
// an Azure LLM inference trace (Azure/AzurePublicDataset), whose header is
// "TIMESTAMP,ContextTokens,GeneratedTokens", or a BurstGPT trace, whose
// header names its columns (see scanBurstGPT). In an Azure trace each
// line after the header is one request. Lines may end in CRLF or LF and
// the last may lack a newline (as in the real files); encoding/csv skips
// empty lines. TIMESTAMP is parsed with AzureTimeLayout (the 2023 traces,
// data/AzureLLMInferenceTrace_*.csv) or, when the first request's is not
// in that form, Azure2024TimeLayout (the 2024 week-long traces); every
// line must then use the first one's form. Arrival is the offset from the
// first request's timestamp. ContextTokens becomes InputLength and
// GeneratedTokens OutputLength; HashIDs is nil; Source says which of the
// two it is.
//
// Each of these is a *ParseError naming the line: a missing or unknown
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
	// The name is the format's (Format Azure, "csv"); the header picks the
	// family.
	lr := &lineLimiter{r: r, line: 1}
	br := bufio.NewReader(lr)
	if err := compressed(br); err != nil {
		return &ParseError{File: name, Line: 1, Err: err}
	}
	skipBOM(br)
	if looksLikeJSON(br) {
		return &ParseError{File: name, Line: 1, Err: &FormatError{Read: Azure, Looks: Mooncake}}
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = 0 // the header's: every record must have as many
	cr.ReuseRecord = true
	var hdr []string
	// wrap words an error of cr.Read. It must not ask cr.FieldPos for the
	// line: after a failed Read no field may have been read, and FieldPos
	// panics. A *csv.ParseError carries its lines: the record's first
	// line is named (a quote left open runs the record to the end of the
	// file), and the line of the fault too when it is another; any other
	// error (a line too long, a read error) happened where lr is reading.
	wrap := func(err error) error {
		var pe *csv.ParseError
		switch {
		case errors.As(err, &pe) && errors.Is(pe.Err, csv.ErrFieldCount):
			return &ParseError{File: name, Line: pe.StartLine, Err: fmt.Errorf("%w: want %d, %s", pe.Err, len(hdr), strings.Join(hdr, ","))}
		case errors.As(err, &pe) && pe.StartLine != pe.Line:
			return &ParseError{File: name, Line: pe.StartLine, Err: fmt.Errorf("%w (in the record starting here, at line %d, column %d)", pe.Err, pe.Line, pe.Column)}
		case errors.As(err, &pe):
			return &ParseError{File: name, Line: pe.StartLine, Err: pe.Err}
		}
		return &ParseError{File: name, Line: lr.line, Err: err}
	}
	h, err := cr.Read()
	if err == io.EOF {
		return &ParseError{File: name, Line: 1, Err: errors.New("empty file: missing header")}
	}
	if err != nil {
		return wrap(err)
	}
	hdr = slices.Clone(h) // cr reuses h
	hdrLine, _ := cr.FieldPos(0)
	if len(hdr) != len(azureHeader) || [3]string(hdr) != azureHeader {
		cols, err := burstGPTColumns(hdr)
		if err != nil {
			return &ParseError{File: name, Line: hdrLine, Err: err}
		}
		return scanBurstGPT(cr, name, cols, wrap, yield)
	}
	var (
		n      int // records read
		first  time.Time
		prev   time.Time
		layout string // the first request's timestamp form, to parse
		shown  string // and to show a time in messages
		source Source
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
			return wrap(err)
		}
		line, _ := cr.FieldPos(0)
		if n == 0 {
			layout, shown, source = AzureTimeLayout, AzureTimeLayout, SourceAzure2023
			if _, err := time.Parse(AzureTimeLayout, rec[0]); err != nil {
				if _, err := time.Parse(Azure2024TimeLayout, rec[0]); err == nil {
					layout, shown, source = Azure2024TimeLayout, "2006-01-02 15:04:05.999999999-07:00", SourceAzure2024
				}
			}
		}
		t, err := time.Parse(layout, rec[0])
		if err != nil {
			example := "2023-11-16 18:17:03.9799600 (7 fractional digits, as on the first line of an Azure 2023 trace)"
			switch {
			case n == 0:
				example = "2023-11-16 18:17:03.9799600 (Azure 2023) or 2024-05-10 00:00:00.009930+00:00 (Azure 2024)"
			case source == SourceAzure2024:
				example = "2024-05-10 00:00:00.009930+00:00 (as on the first line of an Azure 2024 trace)"
			}
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("TIMESTAMP %q: want a time such as %s", rec[0], example)}
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
				Err: fmt.Errorf("%w: %s after %s", ErrTimestampDecreased, rec[0], prev.Format(shown))}
		}
		prev = t
		// Sub saturates at the largest Duration; adding it back detects that.
		arrival := t.Sub(first)
		if !first.Add(arrival).Equal(t) {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("TIMESTAMP %s is too far after the first request's %s: the offset %w",
					rec[0], first.Format(shown), ErrDurationOverflow)}
		}
		record := Record{
			Index:        n,
			Line:         line,
			Arrival:      arrival,
			InputLength:  in,
			OutputLength: out,
			Source:       source,
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
