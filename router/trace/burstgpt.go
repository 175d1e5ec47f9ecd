package trace

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The columns of a BurstGPT trace (HPMLL/BurstGPT README.md, "Schema"):
// BurstGPT_1.csv and BurstGPT_2.csv have the six burstGPTRequired ones,
// "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type";
// the v1.2 release's BurstGPT_3.csv adds the burstGPTOptional ones.
var (
	burstGPTRequired = []string{"Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"}
	burstGPTOptional = []string{"Session ID", "Elapsed time"}
)

// burstGPTCols are the positions of the BurstGPT columns replay reads in
// a header; session is -1 without a Session ID column.
type burstGPTCols struct{ timestamp, request, response, session int }

// burstGPTColumns finds the BurstGPT columns in hdr, in any order. A
// header that is neither Azure's nor one with every BurstGPT column and
// no unknown one is an error in words naming both.
func burstGPTColumns(hdr []string) (burstGPTCols, error) {
	at := make(map[string]int, len(hdr))
	for i, h := range hdr {
		at[h] = i
	}
	unknown := func() error {
		return fmt.Errorf("header %q: want %s (Azure) or %s (BurstGPT, which may add %s)",
			strings.Join(hdr, ","), strings.Join(azureHeader[:], ","), strings.Join(burstGPTRequired, ","), strings.Join(burstGPTOptional, " and "))
	}
	if len(at) != len(hdr) {
		return burstGPTCols{}, fmt.Errorf("%w: a column is repeated", unknown())
	}
	for _, c := range burstGPTRequired {
		if _, ok := at[c]; !ok {
			return burstGPTCols{}, unknown()
		}
	}
	for _, h := range hdr {
		if !slices.Contains(burstGPTRequired, h) && !slices.Contains(burstGPTOptional, h) {
			return burstGPTCols{}, fmt.Errorf("%w: unknown column %q", unknown(), h)
		}
	}
	cols := burstGPTCols{timestamp: at["Timestamp"], request: at["Request tokens"], response: at["Response tokens"], session: -1}
	if i, ok := at["Session ID"]; ok {
		cols.session = i
	}
	return cols, nil
}

// scanBurstGPT reads the requests of a BurstGPT trace from cr, past its
// header (see ReadAzure, which calls it by the header). Timestamp is the
// request's submission time in seconds (from midnight of the trace's
// first day; a decimal number); Arrival is its offset from the first
// request's, rounded to the nanosecond. Request tokens becomes
// InputLength, Response tokens OutputLength, and Session ID (when the
// column is there and the cell not empty) SessionID. Model, Total tokens,
// Log Type and Elapsed time are not read: the simulated fleet serves one
// model, and a request's timing is the simulation's. A failed request
// (Response tokens 0) is kept, as a request that generates no token: it
// arrived and was routed. HashIDs is nil; Source is SourceBurstGPT.
//
// Errors are ReadAzure's, each a *ParseError naming the line: a record
// without the header's number of fields, a Timestamp that is not a
// number of seconds >= 0, a non-integer or negative token count, a
// Timestamp smaller than the previous line's (ErrTimestampDecreased), or
// one too large for a time.Duration in nanoseconds (ErrDurationOverflow).
func scanBurstGPT(cr *csv.Reader, name string, cols burstGPTCols, wrap func(error) error, yield func(*Record) bool) error {
	var (
		n     int // records read
		first time.Duration
		prev  time.Duration
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
			return wrap(err) // not cr.FieldPos: it panics when Read read no field
		}
		line, _ := cr.FieldPos(0)
		ts := rec[cols.timestamp]
		t, err := seconds(ts)
		if err != nil {
			return &ParseError{File: name, Line: line, Err: err}
		}
		in, err := tokenCount("Request tokens", rec[cols.request])
		if err != nil {
			return &ParseError{File: name, Line: line, Err: err}
		}
		out, err := tokenCount("Response tokens", rec[cols.response])
		if err != nil {
			return &ParseError{File: name, Line: line, Err: err}
		}
		if n == 0 {
			first, prev = t, t
		}
		if t < prev {
			return &ParseError{File: name, Line: line,
				Err: fmt.Errorf("%w: Timestamp %s after %s s", ErrTimestampDecreased, ts, strconv.FormatFloat(prev.Seconds(), 'f', -1, 64))}
		}
		prev = t
		record := Record{
			Index:        n,
			Line:         line,
			Arrival:      t - first,
			InputLength:  in,
			OutputLength: out,
			Source:       SourceBurstGPT,
		}
		if cols.session >= 0 {
			record.SessionID = rec[cols.session]
		}
		n++
		if !yield(&record) {
			return nil
		}
	}
}

// seconds parses a BurstGPT Timestamp, a decimal number of seconds >= 0,
// to the nearest nanosecond. Its errors name the column (col).
func seconds(s string) (time.Duration, error) {
	const col = "Timestamp"
	v, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
		if s == "" {
			return 0, fmt.Errorf("%s: empty, want seconds such as 5 or 5.25", col)
		}
		return 0, fmt.Errorf("%s %q: want seconds such as 5 or 5.25", col, s)
	case v < 0:
		return 0, fmt.Errorf("%s: %w (%s)", col, ErrNegative, s)
	case v*1e9 >= math.MaxInt64: // float64(MaxInt64) is 2^63: >= excludes it
		return 0, fmt.Errorf("%s %s s: in nanoseconds it %w", col, s, ErrDurationOverflow)
	}
	return time.Duration(math.Round(v * 1e9)), nil
}
