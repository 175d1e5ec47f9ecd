package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	jsonLine  = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	azureHdr  = "TIMESTAMP,ContextTokens,GeneratedTokens"
	azureLine = "2023-11-16 18:17:03.9799600,4808,10"
)

// TestFormatMismatch: a trace in the other format (the wrong extension)
// says what it looks like, at its first line.
func TestFormatMismatch(t *testing.T) {
	for _, tt := range []struct {
		name, in    string
		read, looks Format
		want        string
	}{
		{"t.csv", jsonLine + "\n", Azure, Mooncake, "t.csv:1: looks like JSON lines (a Mooncake trace), not CSV (an Azure or BurstGPT trace)"},
		{"t.csv", "\n  " + jsonLine + "\n", Azure, Mooncake, "t.csv:1: looks like JSON lines (a Mooncake trace), not CSV (an Azure or BurstGPT trace)"},
		{"t.jsonl", azureHdr + "\r\n" + azureLine + "\r\n", Mooncake, Azure, "t.jsonl:1: looks like CSV (an Azure or BurstGPT trace), not JSON lines (a Mooncake trace)"},
		{"t.jsonl", "a,b,c\n", Mooncake, Azure, "t.jsonl:1: looks like CSV (an Azure or BurstGPT trace), not JSON lines (a Mooncake trace)"},
	} {
		_, err := Read(strings.NewReader(tt.in), tt.name)
		checkParseError(t, err, tt.want, 1, nil)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Read != tt.read || fe.Looks != tt.looks {
			t.Errorf("%s %q: %v, want a *FormatError{%s, %s}", tt.name, tt.in, err, tt.read, tt.looks)
		}
	}
	// Not CSV-like, or not on the first line: the usual errors.
	for _, tt := range []struct{ in, want string }{
		{"hello\n", "t.jsonl:1: invalid JSON at column 1: invalid character 'h' looking for beginning of value"},
		{jsonLine + "\na,b\n", "t.jsonl:2: invalid JSON at column 1: invalid character 'a' looking for beginning of value"},
		// JSON with commas is JSON, not CSV: the error says what it is.
		{"[1,2]\n", "t.jsonl:1: the line is a JSON array, not an object"},
		{"[1,2\n", "t.jsonl:1: invalid JSON: unexpected end of line"},
		{`"a,b"` + "\n", "t.jsonl:1: the line is a JSON string, not an object"},
	} {
		_, err := ReadMooncake(strings.NewReader(tt.in), "t.jsonl")
		var fe *FormatError
		if errors.As(err, &fe) || err == nil || err.Error() != tt.want {
			t.Errorf("%q: %v, want %q", tt.in, err, tt.want)
		}
	}
}

// TestReadAs: the format given overrides the name's extension.
func TestReadAs(t *testing.T) {
	recs, err := ReadAs(strings.NewReader(jsonLine+"\n"), "stdin", Mooncake)
	if err != nil || len(recs) != 1 || recs[0].InputLength != 600 {
		t.Errorf("Mooncake: %+v, %v", recs, err)
	}
	recs, err = ReadAs(strings.NewReader(azureHdr+"\n"+azureLine+"\n"), "trace.txt", Azure)
	if err != nil || len(recs) != 1 || recs[0].InputLength != 4808 {
		t.Errorf("Azure: %+v, %v", recs, err)
	}
	if _, err := ReadAs(strings.NewReader(""), "x", "yaml"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("yaml: %v, want ErrUnknownFormat", err)
	}
	for name, want := range map[string]Format{"a.jsonl": Mooncake, "A.JSONL": Mooncake, "b.CSV": Azure, "c.json": "", "-": ""} {
		if got := FormatOf(name); got != want {
			t.Errorf("FormatOf(%q) = %q, want %q", name, got, want)
		}
	}
}

// endless is an endless input of one byte, as /dev/zero is.
type endless byte

func (e endless) Read(p []byte) (int, error) {
	if len(p) > 0 {
		p[0] = byte(e)
		for n := 1; n < len(p); n *= 2 {
			copy(p[n:], p[:n])
		}
	}
	return len(p), nil
}

// TestLineTooLong: a line over MaxLineBytes is an error naming its line,
// also in an endless input (which would otherwise be read for ever).
func TestLineTooLong(t *testing.T) {
	long := strings.Repeat("x", MaxLineBytes+1)
	for _, tt := range []struct {
		name string
		in   io.Reader
		line int
		want string
	}{
		{"t.jsonl", strings.NewReader(jsonLine + "\n" + long + "\n"), 2,
			"t.jsonl:2: line too long: over 16 MiB, the limit for one trace line"},
		{"t.jsonl", endless(0), 1, "t.jsonl:1: line too long: over 16 MiB, the limit for one trace line"},
		{"a.csv", strings.NewReader(azureHdr + "\r\n" + azureLine + "\r\n" + long), 3,
			"a.csv:3: line too long: over 16 MiB, the limit for one trace line"},
		{"a.csv", endless(0), 1, "a.csv:1: line too long: over 16 MiB, the limit for one trace line"},
		{"a.csv", io.MultiReader(strings.NewReader(azureHdr+"\n"), endless('7')), 2,
			"a.csv:2: line too long: over 16 MiB, the limit for one trace line"},
	} {
		_, err := Read(tt.in, tt.name)
		checkParseError(t, err, tt.want, tt.line, ErrLineTooLong)
	}
}

// TestLineLimiterBoundary: a line of exactly MaxLineBytes bytes passes,
// one byte more does not.
func TestLineLimiterBoundary(t *testing.T) {
	at := bytes.Repeat([]byte("x"), MaxLineBytes)
	in := append(append([]byte("a\n"), at...), "\nb\n"...)
	l := &lineLimiter{r: bytes.NewReader(in), line: 1}
	if b, err := io.ReadAll(l); err != nil || !bytes.Equal(b, in) {
		t.Fatalf("a line of MaxLineBytes: %d bytes, %v", len(b), err)
	}
	if l.line != 4 {
		t.Errorf("line %d after 3 lines, want 4", l.line)
	}
	in = append(append([]byte("a\n"), at...), "x\nb\n"...)
	l = &lineLimiter{r: bytes.NewReader(in), line: 1}
	if _, err := io.ReadAll(l); !errors.Is(err, ErrLineTooLong) || l.line != 2 {
		t.Fatalf("a line of MaxLineBytes+1: %v at line %d, want ErrLineTooLong at line 2", err, l.line)
	}
}

// BenchmarkReadAzure reads the bundled Azure conversation trace (19,366
// requests) through ReadAzure, line limit and format check included.
func BenchmarkReadAzure(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(traceDir, "azure_llm_2023_conv.csv"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		recs, err := ReadAzure(bytes.NewReader(data), "conv.csv")
		if err != nil || len(recs) != 19366 {
			b.Fatalf("%d records, %v", len(recs), err)
		}
	}
}

// TestCompressedTrace: a compressed trace, read as either format, is
// named compressed at line 1, not taken for CSV (gzip's bytes hold no '{'
// and may hold a ','), whatever its name.
func TestCompressedTrace(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write([]byte(jsonLine + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		in     []byte
		f      Format
		name   string
		compre string
	}{
		{gz.Bytes(), Mooncake, "gzip", "zcat"},
		{gz.Bytes(), Azure, "gzip", "zcat"},
		{[]byte("\x28\xb5\x2f\xfd\x04\x00"), Mooncake, "zstd", "zstdcat"},
		{[]byte("BZh91AY&SY"), Azure, "bzip2", "bzcat"},
		{[]byte("\xfd7zXZ\x00\x00"), Mooncake, "xz", "xzcat"},
	} {
		_, err := ReadAs(bytes.NewReader(tt.in), "t.gz", tt.f)
		checkParseError(t, err, "t.gz:1: compressed with "+tt.name+", not a text trace", 1, nil)
		var ce *CompressedError
		if !errors.As(err, &ce) || ce.Name != tt.name || ce.Decompressor != tt.compre {
			t.Errorf("%s as %s: %v, want a *CompressedError for %s (%s)", tt.name, tt.f, err, tt.name, tt.compre)
		}
	}
}
