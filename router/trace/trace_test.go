package trace

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

const traceDir = "../../testdata/traces"

func seq(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// TestRealTraces parses the four shipped traces and checks the record
// counts of shared/data/traces/README.md and the first and last lines,
// copied by hand from the files.
func TestRealTraces(t *testing.T) {
	tests := []struct {
		file        string
		count       int
		first, last Record
	}{
		{
			file: "mooncake_conversation_trace.jsonl", count: 12031,
			first: Record{Source: SourceMooncake, Index: 0, Line: 1, Arrival: 0, InputLength: 6758, OutputLength: 500, HashIDs: seq(0, 13)},
			last: Record{Source: SourceMooncake, Index: 12030, Line: 12031, Arrival: 3536999 * time.Millisecond, InputLength: 20774, OutputLength: 508,
				HashIDs: append([]uint64{0}, seq(182750, 182789)...)},
		},
		{
			file: "mooncake_arxiv_trace_first1000.jsonl", count: 1000,
			first: Record{Source: SourceMooncake, Index: 0, Line: 1, Arrival: 0, InputLength: 6755, OutputLength: 500, HashIDs: seq(0, 13)},
			last: Record{Source: SourceMooncake, Index: 999, Line: 1000, Arrival: 177098 * time.Millisecond, InputLength: 6689, OutputLength: 3,
				HashIDs: append(seq(46, 57), 12825, 12826)},
		},
		{
			// 2023-11-16 18:17:03.9799600 → 19:14:19.9280160
			file: "azure_llm_2023_code.csv", count: 8819,
			first: Record{Source: SourceAzure2023, Index: 0, Line: 2, Arrival: 0, InputLength: 4808, OutputLength: 10},
			last: Record{Source: SourceAzure2023, Index: 8818, Line: 8820, Arrival: 57*time.Minute + 15*time.Second + 948056*time.Microsecond,
				InputLength: 549, OutputLength: 173},
		},
		{
			// 2023-11-16 18:15:46.6805900 → 19:14:08.4025270
			file: "azure_llm_2023_conv.csv", count: 19366,
			first: Record{Source: SourceAzure2023, Index: 0, Line: 2, Arrival: 0, InputLength: 374, OutputLength: 44},
			last: Record{Source: SourceAzure2023, Index: 19365, Line: 19367, Arrival: 58*time.Minute + 21*time.Second + 721937*time.Microsecond,
				InputLength: 197, OutputLength: 183},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			recs, err := ReadFile(filepath.Join(traceDir, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != tt.count {
				t.Fatalf("got %d records, want %d", len(recs), tt.count)
			}
			if !reflect.DeepEqual(recs[0], tt.first) {
				t.Errorf("first = %+v, want %+v", recs[0], tt.first)
			}
			if got := recs[len(recs)-1]; !reflect.DeepEqual(got, tt.last) {
				t.Errorf("last = %+v, want %+v", got, tt.last)
			}
			for i, r := range recs {
				if r.Index != i || (i > 0 && r.Arrival < recs[i-1].Arrival) {
					t.Fatalf("record %d: index %d arrival %v not ordered", i, r.Index, r.Arrival)
				}
			}
		})
	}
}

func TestMooncakeGood(t *testing.T) {
	in := `{"timestamp": 3000, "input_length": 512, "output_length": 1, "hash_ids": [7]}` + "\r\n" +
		`{"hash_ids":[7,18446744073709551615],"output_length":0,"input_length":513,"timestamp":3000}` + "\n" +
		`{"timestamp": 4500, "input_length": 0, "output_length": 2, "hash_ids": []}` + "\n\n  \n"
	recs, err := ReadMooncake(strings.NewReader(in), "x.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Source: SourceMooncake, Index: 0, Line: 1, Arrival: 0, InputLength: 512, OutputLength: 1, HashIDs: []uint64{7}},
		{Source: SourceMooncake, Index: 1, Line: 2, Arrival: 0, InputLength: 513, OutputLength: 0, HashIDs: []uint64{7, 1<<64 - 1}},
		{Source: SourceMooncake, Index: 2, Line: 3, Arrival: 1500 * time.Millisecond, InputLength: 0, OutputLength: 2},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
}

// TestNoRecords checks that a trace without a single request is an error
// wrapping ErrNoRecords that names the file, in both formats; an empty
// CSV lacks even its header, which is a line error.
func TestNoRecords(t *testing.T) {
	tests := []struct {
		name, file, in string
		want           string
		noRecords      bool
	}{
		{"empty jsonl", "e.jsonl", "", "e.jsonl: no records", true},
		{"blank jsonl", "b.jsonl", "\n  \r\n\n", "b.jsonl: no records", true},
		{"header-only csv", "h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "h.csv: no records", true},
		{"header-only csv, blank lines", "h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n\n\n", "h.csv: no records", true},
		{"empty csv", "e.csv", "", "e.csv:1: empty file: missing header", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := Read(strings.NewReader(tt.in), tt.file)
			if err == nil {
				t.Fatalf("got %d records and no error, want %q", len(recs), tt.want)
			}
			if recs != nil {
				t.Errorf("records %v with the error, want nil", recs)
			}
			if err.Error() != tt.want {
				t.Errorf("error %q, want %q", err, tt.want)
			}
			if got := errors.Is(err, ErrNoRecords); got != tt.noRecords {
				t.Errorf("errors.Is(err, ErrNoRecords) = %v, want %v", got, tt.noRecords)
			}
		})
	}
}

// TestMooncakeJSONRules pins what encoding/json accepts beyond the
// canonical form: field names match case-insensitively, the last of
// repeated fields wins, and -0 is 0.
func TestMooncakeJSONRules(t *testing.T) {
	in := `{"Timestamp": 7, "INPUT_LENGTH": 1, "output_Length": 2, "Hash_IDs": [-0]}` + "\n" +
		`{"timestamp": 0, "timestamp": 9, "input_length": 1, "output_length": 5, "hash_ids": [3], "hash_ids": [4]}` + "\n"
	recs, err := ReadMooncake(strings.NewReader(in), "j.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Source: SourceMooncake, Index: 0, Line: 1, Arrival: 0, InputLength: 1, OutputLength: 2, HashIDs: []uint64{0}},
		{Source: SourceMooncake, Index: 1, Line: 2, Arrival: 2 * time.Millisecond, InputLength: 1, OutputLength: 5, HashIDs: []uint64{4}},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
}

func TestMooncakeErrors(t *testing.T) {
	const ok = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	tests := []struct {
		name, line2 string // line 2 of a trace whose line 1 is ok
		want        string // full error message
		is          error
	}{
		{"unknown field", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "x": 1}`,
			`t.jsonl:2: unknown field "x"`, nil},
		{"missing field", `{"timestamp": 0, "input_length": 1, "hash_ids": [1]}`,
			`t.jsonl:2: missing or null field "output_length"`, nil},
		{"missing hash_ids", `{"timestamp": 0, "input_length": 1, "output_length": 5}`,
			`t.jsonl:2: missing or null field "hash_ids"`, nil},
		{"null", `{"timestamp": null, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: missing or null field "timestamp"`, nil},
		{"null hash_ids", `{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": null}`,
			`t.jsonl:2: missing or null field "hash_ids"`, nil},
		{"duplicate field, last null", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "timestamp": null}`,
			`t.jsonl:2: missing or null field "timestamp"`, nil},
		{"null id", `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, null]}`,
			`t.jsonl:2: hash_ids: null, want an integer`, nil},
		{"string", `{"timestamp": "0", "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: timestamp: string, want an integer`, nil},
		{"string id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": ["1"]}`,
			`t.jsonl:2: hash_ids: string "1", want an integer`, nil},
		{"bool", `{"timestamp": 0, "input_length": true, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: input_length: bool, want an integer`, nil},
		// policy_class and session_id are strings: the message says so,
		// whatever the wrong type.
		{"number session_id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "session_id": 5}`,
			`t.jsonl:2: session_id: number, want a string`, nil},
		{"number policy_class", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "policy_class": 7}`,
			`t.jsonl:2: policy_class: number, want a string`, nil},
		{"array session_id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "session_id": ["a"]}`,
			`t.jsonl:2: session_id: array, want a string`, nil},
		{"bool policy_class", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "policy_class": true}`,
			`t.jsonl:2: policy_class: bool, want a string`, nil},
		{"string priority", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1], "priority": "high"}`,
			`t.jsonl:2: priority: string, want an integer`, nil},
		{"hash_ids not an array", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": 1}`,
			`t.jsonl:2: hash_ids: number, want an array of integers`, nil},
		{"negative length", `{"timestamp": 0, "input_length": -1, "output_length": 5, "hash_ids": []}`,
			`t.jsonl:2: input_length: negative value (-1)`, ErrNegative},
		{"negative timestamp", `{"timestamp": -5, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: timestamp: negative value (-5)`, ErrNegative},
		{"negative id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [-3]}`,
			`t.jsonl:2: hash_ids: negative value (-3)`, ErrNegative},
		{"float", `{"timestamp": 1.5, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: timestamp: 1.5 is not an integer`, nil},
		{"exponent", `{"timestamp": 0, "input_length": 1, "output_length": 1e3, "hash_ids": [1]}`,
			`t.jsonl:2: output_length: 1e3 is not an integer`, nil},
		{"float id", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [2.0]}`,
			`t.jsonl:2: hash_ids: 2.0 is not an integer`, nil},
		{"too few ids", `{"timestamp": 0, "input_length": 1025, "output_length": 5, "hash_ids": [1, 2]}`,
			`t.jsonl:2: hash_ids length does not match input_length: 2 ids for input_length 1025, want 3`, ErrHashIDCount},
		{"too many ids", `{"timestamp": 0, "input_length": 512, "output_length": 5, "hash_ids": [1, 2]}`,
			`t.jsonl:2: hash_ids length does not match input_length: 2 ids for input_length 512, want 1`, ErrHashIDCount},
		{"invalid json", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1]`,
			`t.jsonl:2: invalid JSON: unexpected end of line`, nil},
		{"syntax error", `{"timestamp": 0, "input_length": 1, "output_length": 5 "hash_ids": [1]}`,
			`t.jsonl:2: invalid JSON at column 56: invalid character '"' after object key:value pair`, nil},
		{"trailing data", ok + ` {}`,
			`t.jsonl:2: invalid JSON: trailing data after the object at column 79`, nil},
		{"trailing garbage", ok + `x`,
			`t.jsonl:2: invalid JSON: trailing data after the object at column 78`, nil},
		{"trailing non-JSON space", ok + "\u00a0",
			`t.jsonl:2: invalid JSON: trailing data after the object at column 78`, nil},
		{"not an object", `[1]`,
			`t.jsonl:2: the line is a JSON array, not an object`, nil},
		{"a string, not an object", `"x"`,
			`t.jsonl:2: the line is a JSON string, not an object`, nil},
		{"a boolean, not an object", `true`,
			`t.jsonl:2: the line is a JSON boolean, not an object`, nil},
		{"overflow", `{"timestamp": 99999999999999999999, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: timestamp: value 99999999999999999999 out of range`, nil},
		{"id overflow", `{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [18446744073709551616]}`,
			`t.jsonl:2: hash_ids: value 18446744073709551616 out of range`, nil},
		{"duration overflow", `{"timestamp": 9223372036854776, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
			`t.jsonl:2: timestamp 9223372036854776 ms overflows a time.Duration`, ErrDurationOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(ok+"\n"+tt.line2+"\n"), "t.jsonl")
			checkParseError(t, err, tt.want, 2, tt.is)
		})
	}
	t.Run("decreasing timestamp", func(t *testing.T) {
		in := strings.Replace(ok, `"timestamp": 0`, `"timestamp": 6000`, 1) + "\n" +
			strings.Replace(ok, `"timestamp": 0`, `"timestamp": 3000`, 1) + "\n"
		_, err := ReadMooncake(strings.NewReader(in), "t.jsonl")
		checkParseError(t, err, "t.jsonl:2: timestamp decreases: 3000 ms after 6000 ms", 2, ErrTimestampDecreased)
	})
	t.Run("blank line in the middle", func(t *testing.T) {
		_, err := ReadMooncake(strings.NewReader(ok+"\n\n"+ok+"\n"), "t.jsonl")
		checkParseError(t, err, "t.jsonl:2: blank line before the end of the trace", 2, nil)
	})
}

func TestAzureGood(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\r\n" +
		"2023-11-16 18:17:03.9799600,4808,10\r\n" +
		"2023-11-16 18:17:03.9799600,0,0\r\n" +
		"2023-11-16 18:17:05.0000000,110,27"
	recs, err := ReadAzure(strings.NewReader(in), "a.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Source: SourceAzure2023, Index: 0, Line: 2, Arrival: 0, InputLength: 4808, OutputLength: 10},
		{Source: SourceAzure2023, Index: 1, Line: 3, Arrival: 0, InputLength: 0, OutputLength: 0},
		{Source: SourceAzure2023, Index: 2, Line: 4, Arrival: 1020040 * time.Microsecond, InputLength: 110, OutputLength: 27},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v\nwant %+v", recs, want)
	}
}

// TestAzureLongestOffset checks the edge of the Duration range: an offset
// of exactly 2^63−1 ns is no longer representable at 100 ns resolution,
// so the largest accepted offset is the last whole 100 ns below it.
func TestAzureLongestOffset(t *testing.T) {
	first := time.Date(2023, 11, 16, 18, 17, 3, 0, time.UTC)
	longest := time.Duration(math.MaxInt64).Truncate(100 * time.Nanosecond)
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		first.Format(AzureTimeLayout) + ",1,1\n" +
		first.Add(longest).Format(AzureTimeLayout) + ",2,2\n"
	recs, err := ReadAzure(strings.NewReader(in), "a.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[1].Arrival != longest {
		t.Fatalf("got %+v, want the second arrival at %v", recs, longest)
	}
	in += first.Add(longest).Add(100*time.Nanosecond).Format(AzureTimeLayout) + ",3,3\n"
	_, err = ReadAzure(strings.NewReader(in), "a.csv")
	checkParseError(t, err, "a.csv:4: TIMESTAMP 2316-02-26 18:04:19.8547759 is too far after the first request's "+
		"2023-11-16 18:17:03.0000000: the offset overflows a time.Duration", 4, ErrDurationOverflow)
}

func TestAzureErrors(t *testing.T) {
	const hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"
	tests := []struct {
		name, in string
		line     int
		want     string
		is       error
	}{
		{"empty", "", 1, "a.csv:1: empty file: missing header", nil},
		{"bad header", "TIMESTAMP,Context,GeneratedTokens\r\n", 1,
			`a.csv:1: header "TIMESTAMP,Context,GeneratedTokens": want TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or ` +
				`Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type (BurstGPT, which may add Session ID and Elapsed time)`, nil},
		{"field count", hdr + "2023-11-16 18:17:04.0319600,3180\r\n", 3,
			"a.csv:3: wrong number of fields: want 3, TIMESTAMP,ContextTokens,GeneratedTokens", nil},
		{"bad time", hdr + "2023-11-16 18:17:04.03196,3180,8\r\n", 3,
			`a.csv:3: TIMESTAMP "2023-11-16 18:17:04.03196": want a time such as 2023-11-16 18:17:03.9799600 (7 fractional digits, as on the first line of an Azure 2023 trace)`, nil},
		{"bad count", hdr + "2023-11-16 18:17:04.0319600,x,8\r\n", 3,
			`a.csv:3: ContextTokens: x is not an integer`, nil},
		{"empty count", hdr + "2023-11-16 18:17:04.0319600,,8\r\n", 3,
			`a.csv:3: ContextTokens: empty, want an integer`, nil},
		{"float count", hdr + "2023-11-16 18:17:04.0319600,3180,8.5\r\n", 3,
			`a.csv:3: GeneratedTokens: 8.5 is not an integer`, nil},
		{"huge count", hdr + "2023-11-16 18:17:04.0319600,99999999999999999999,8\r\n", 3,
			`a.csv:3: ContextTokens: value 99999999999999999999 out of range`, nil},
		{"negative", hdr + "2023-11-16 18:17:04.0319600,3180,-8\r\n", 3,
			"a.csv:3: GeneratedTokens: negative value (-8)", ErrNegative},
		{"decreasing", hdr + "\r\n2023-11-16 18:17:03.0000000,3180,8", 4,
			"a.csv:4: timestamp decreases: 2023-11-16 18:17:03.0000000 after 2023-11-16 18:17:03.9799600", ErrTimestampDecreased},
		{"bare quote", hdr + "2023-11-16 18:17:04.0319600,3\"1,8\r\n", 3,
			`a.csv:3: bare " in non-quoted-field`, nil},
		// A failed csv.Reader.Read may have read no field: the line is the
		// *csv.ParseError's, never cr.FieldPos's (which panicked here).
		{"unclosed quote", "TIMESTAMP,ContextTokens,GeneratedTokens\n\"2023-11-16 18:15:46.6805900,374,44\n", 2,
			`a.csv:2: extraneous or missing " in quoted-field`, nil},
		{"unclosed quote, more lines", hdr + "\"2023-11-16 18:17:04.0319600,3180,8\r\n2023-11-16 18:17:05.0000000,1,1\r\n", 3,
			`a.csv:3: extraneous or missing " in quoted-field (in the record starting here, at line 4, column 33)`, nil},
		{"unclosed quote in the header", "\"TIMESTAMP,ContextTokens,GeneratedTokens\n", 1,
			`a.csv:1: extraneous or missing " in quoted-field`, nil},
		{"text after a closing quote", hdr + "\"2023-11-16 18:17:04.0319600\"x,3180,8\r\n", 3,
			`a.csv:3: extraneous or missing " in quoted-field`, nil},
		// Time.Sub saturates at about 292 years; the offset must not.
		{"offset overflow", hdr + "2023-11-16 18:17:05.0000000,1,1\r\n2400-01-01 00:00:00.0000000,3180,8\r\n", 4,
			"a.csv:4: TIMESTAMP 2400-01-01 00:00:00.0000000 is too far after the first request's 2023-11-16 18:17:03.9799600: " +
				"the offset overflows a time.Duration", ErrDurationOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadAzure(strings.NewReader(tt.in), "a.csv")
			checkParseError(t, err, tt.want, tt.line, tt.is)
		})
	}
}

func checkParseError(t *testing.T, err error, want string, line int, is error) {
	t.Helper()
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T), want *ParseError", err, err)
	}
	if err.Error() != want {
		t.Errorf("error\n got %q\nwant %q", err.Error(), want)
	}
	if pe.Line != line {
		t.Errorf("line %d, want %d", pe.Line, line)
	}
	if is != nil && !errors.Is(err, is) {
		t.Errorf("errors.Is(%v, %v) = false", err, is)
	}
}

func TestReadDispatch(t *testing.T) {
	if _, err := Read(strings.NewReader(""), "x.txt"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("x.txt: %v, want ErrUnknownFormat", err)
	}
	recs, err := Read(strings.NewReader(`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [9]}`), "X.JSONL")
	if err != nil || len(recs) != 1 || recs[0].HashIDs[0] != 9 {
		t.Errorf("X.JSONL: %+v, %v", recs, err)
	}
	recs, err = Read(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4,1\n"), "y.csv")
	if err != nil || len(recs) != 1 || recs[0].InputLength != 4 {
		t.Errorf("y.csv: %+v, %v", recs, err)
	}
	if _, err := ReadFile(filepath.Join(traceDir, "missing.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}` + "\n"))
	f.Add([]byte(`{"hash_ids":[],"output_length":0,"input_length":0,"timestamp":0}` + "\n\n"))
	f.Add([]byte(`{"\u0074imestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`))
	f.Add([]byte("{\"timestamp\": 1e3}\n[\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadMooncake(strings.NewReader(string(data)), "f.jsonl")
		if errors.Is(err, ErrNoRecords) {
			if err.Error() != "f.jsonl: no records" || len(bytes.TrimSpace(data)) != 0 {
				t.Fatalf("no records in %q: %v", data, err)
			}
			return
		}
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line < 1 || !strings.HasPrefix(err.Error(), "f.jsonl:"+strconv.Itoa(pe.Line)+": ") {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		for i, r := range recs {
			if r.Index != i || r.InputLength < 0 || r.OutputLength < 0 || r.Arrival < 0 ||
				len(r.HashIDs) != (r.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens {
				t.Fatalf("bad record %+v", r)
			}
		}
	})
}

// BenchmarkReadMooncake reads the bundled 12,031-line conversation trace.
func BenchmarkReadMooncake(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(traceDir, "mooncake_conversation_trace.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		recs, err := ReadMooncake(bytes.NewReader(data), "conv.jsonl")
		if err != nil || len(recs) != 12031 {
			b.Fatalf("%d records, %v", len(recs), err)
		}
	}
}

func TestMooncakeOptionalClassifierFields(t *testing.T) {
	src := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "priority": 5, "policy_class": "batch", "session_id": "s-1"}
{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1]}
`
	recs, err := ReadMooncake(strings.NewReader(src), "c.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if r := recs[0]; r.Priority != 5 || !r.HasPriority || r.PolicyClass != "batch" || r.SessionID != "s-1" {
		t.Fatalf("record 0: %+v", r)
	}
	if r := recs[1]; r.HasPriority || r.PolicyClass != "" || r.SessionID != "" {
		t.Fatalf("record 1: %+v", r)
	}
	bad := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "priority": "high"}` + "\n"
	if _, err := ReadMooncake(strings.NewReader(bad), "c.jsonl"); err == nil || !strings.Contains(err.Error(), "c.jsonl:1:") {
		t.Fatalf("string priority: err = %v", err)
	}
}
