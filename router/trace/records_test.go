package trace

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestRecordsMatchesRead streams the shipped traces with FileRecords and
// checks every record equals ReadFileAs's.
func TestRecordsMatchesRead(t *testing.T) {
	for _, file := range []string{"mooncake_arxiv_trace_first1000.jsonl", "azure_llm_2023_code.csv"} {
		path := filepath.Join(traceDir, file)
		want, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var got []Record
		for rec, err := range FileRecords(path, FormatOf(path)) {
			if err != nil {
				t.Fatalf("%s: record %d: %v", file, len(got), err)
			}
			got = append(got, *rec)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: streamed %d records, differ from the %d read", file, len(got), len(want))
		}
	}
}

// TestRecordsErrors checks a stream yields the records before a malformed
// line, then the error ReadAs returns for it, once, and nothing after;
// and that an input with no records and an unknown format are errors too.
func TestRecordsErrors(t *testing.T) {
	for _, c := range []struct {
		name, in string
		f        Format
		records  int
	}{
		{"bad.jsonl", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [7]}\n" +
			"{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [8]}\n" +
			"{\"timestamp\": 3, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\n" +
			"{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\n", Mooncake, 2},
		{"bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:04.9799600,x,2\n", Azure, 1},
		{"empty.jsonl", "\n\n", Mooncake, 0},
		{"t.txt", "", "txt", 0},
	} {
		_, want := ReadAs(strings.NewReader(c.in), c.name, c.f)
		if want == nil {
			t.Fatalf("%s: ReadAs succeeded, want an error", c.name)
		}
		var n, errs int
		for rec, err := range Records(strings.NewReader(c.in), c.name, c.f) {
			if err != nil {
				errs++
				if rec != nil || err.Error() != want.Error() {
					t.Errorf("%s: yielded (%v, %v), want (nil, %v)", c.name, rec, err, want)
				}
				continue
			}
			if errs > 0 {
				t.Errorf("%s: record %d after the error", c.name, rec.Index)
			}
			n++
		}
		if n != c.records || errs != 1 {
			t.Errorf("%s: %d records and %d errors, want %d and 1", c.name, n, errs, c.records)
		}
	}
}

// TestRecordsStopEarly checks a range that breaks stops the reading
// without an error, and that FileRecords yields an open error.
func TestRecordsStopEarly(t *testing.T) {
	path := filepath.Join(traceDir, "mooncake_conversation_trace.jsonl")
	var last *Record
	for rec, err := range FileRecords(path, Mooncake) {
		if err != nil {
			t.Fatal(err)
		}
		if last = rec; rec.Index == 9 {
			break
		}
	}
	if last == nil || last.Index != 9 || last.Line != 10 {
		t.Errorf("stopped at %+v, want index 9, line 10", last)
	}
	for rec, err := range FileRecords(filepath.Join(traceDir, "missing.jsonl"), Mooncake) {
		if rec != nil || err == nil || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing file: yielded (%v, %v), want a not-exist error", rec, err)
		}
	}
}
