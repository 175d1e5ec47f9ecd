package trace

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestOpenHeldOrStreamed opens the arXiv sample held in memory and
// streamed (more requests than it may hold), with and without a limit,
// and checks both give the same requests, count and prefix-hash note; and
// that a malformed line past the limit fails the load either way.
func TestOpenHeldOrStreamed(t *testing.T) {
	const path = "../../testdata/traces/mooncake_arxiv_trace_first1000.jsonl"
	for _, limit := range []int{0, 250} {
		held, err := Open(path, "", nil, limit, 1000)
		if err != nil {
			t.Fatal(err)
		}
		streamed, err := Open(path, "", nil, limit, 100)
		if err != nil {
			t.Fatal(err)
		}
		want := min(1000, limit)
		if limit == 0 {
			want = 1000
		}
		if held.Stream != nil || len(held.Records) != want || streamed.Records != nil || streamed.Stream == nil {
			t.Fatalf("limit %d: held %d records (stream %v), streamed %d records (stream %v); want %d held, and a stream",
				limit, len(held.Records), held.Stream != nil, len(streamed.Records), streamed.Stream != nil, want)
		}
		var got []Record
		for rec, err := range streamed.Stream {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, *rec)
		}
		if !reflect.DeepEqual(got, held.Records) {
			t.Errorf("limit %d: streamed %d records, differ from the %d held", limit, len(got), len(held.Records))
		}
		if held.Requests != want || streamed.Requests != want || !held.Hashes || !streamed.Hashes || held.Name != streamed.Name {
			t.Errorf("limit %d: held %+v, streamed %+v; want %d requests with hashes", limit,
				[]any{held.Name, held.Requests, held.Hashes}, []any{streamed.Name, streamed.Requests, streamed.Hashes}, want)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, append(b, "{\"timestamp\": 1}\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, hold := range []int{2000, 100} {
		if _, err := Open(bad, "", nil, 10, hold); err == nil || !strings.Contains(err.Error(), "bad.jsonl:1001: ") {
			t.Errorf("hold %d: a malformed line 1001 with limit 10: %v", hold, err)
		}
	}
}

// A trace without a request fails to open, named.
func TestOpenEmptyTrace(t *testing.T) {
	for _, tt := range []struct{ name, content string }{
		{"empty.jsonl", ""},
		{"blank.jsonl", "\n\n"},
		{"header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"},
	} {
		file := filepath.Join(t.TempDir(), tt.name)
		if err := os.WriteFile(file, []byte(tt.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(file, "", nil, 0, DefaultHold); err == nil || err.Error() != file+": no records" {
			t.Errorf("%s: %v, want %q", tt.name, err, file+": no records")
		}
	}
}
