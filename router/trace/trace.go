// Package trace reads recorded LLM request traces for router replay: the
// Mooncake JSONL traces (kvcache-ai/Mooncake FAST'25 release and the
// ai-dynamo/dynamo arXiv sample) and the CSV traces: the Azure LLM
// inference traces (Azure/AzurePublicDataset, 2023 and 2024) and BurstGPT
// (HPMLL/BurstGPT), told apart by their header. The formats are described
// in shared/data/traces/README.md and testdata/traces/README.md.
//
// Readers are strict: every malformed line is reported as a *ParseError that
// names the file and the 1-based line, so a corrupted trace fails loudly
// instead of silently skewing a replay.
package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"iter"
	"path/filepath"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile"
)

// MooncakeBlockTokens is the number of prompt tokens covered by one Mooncake
// hash id: every Mooncake trace line carries ceil(input_length/512) ids
// (shared/data/traces/README.md §1, §2).
const MooncakeBlockTokens = 512

// Record is one request of a recorded trace.
type Record struct {
	// Index is the 0-based position of the request in the trace.
	Index int
	// Line is the 1-based line number of the request in the file (the Azure
	// header is line 1, so its first request is line 2).
	Line int
	// Arrival is the arrival time since the trace's first request (so the
	// first record has Arrival 0). Mooncake timestamps have millisecond
	// resolution, Azure timestamps 100 ns.
	Arrival time.Duration
	// InputLength is the number of prompt tokens (>= 0).
	InputLength int
	// OutputLength is the number of generated tokens (>= 0).
	OutputLength int
	// HashIDs are the Mooncake prefix-block ids, one per MooncakeBlockTokens
	// prompt tokens (the last id may cover a partial block), so
	// len(HashIDs) == ceil(InputLength/512). Two requests share a KV prefix
	// exactly as far as their leading ids are equal. The ids are not chained:
	// id k names the content of block k only. Nil for Azure records.
	HashIDs []uint64
	// Priority (valid when HasPriority), PolicyClass and SessionID are the
	// optional Mooncake fields `priority`, `policy_class` and `session_id`
	// that a generated trace may carry for request classifiers; the
	// published traces have none.
	Priority    int
	HasPriority bool
	PolicyClass string
	SessionID   string
	// Source is the trace family the record was read as (the same for
	// every record of a trace): SourceMooncake, SourceAzure2023,
	// SourceAzure2024 or SourceBurstGPT.
	Source Source
}

// Source names a published trace family, as messages word it.
type Source string

// The trace families the readers know. Only Mooncake traces carry prefix
// hashes; the others have token counts only.
const (
	// SourceMooncake: Mooncake JSON lines (kvcache-ai/Mooncake, and what
	// router trace generate writes), read by ReadMooncake.
	SourceMooncake Source = "Mooncake"
	// SourceAzure2023: the Azure LLM inference traces of 2023
	// (AzureLLMInferenceTrace_{code,conv}.csv), read by ReadAzure.
	SourceAzure2023 Source = "Azure 2023"
	// SourceAzure2024: the Azure LLM inference week-long traces of 2024
	// (AzureLLMInferenceTrace_{code,conv}_1week.csv), read by ReadAzure.
	SourceAzure2024 Source = "Azure 2024"
	// SourceBurstGPT: the BurstGPT traces (HPMLL/BurstGPT,
	// BurstGPT_*.csv), read by ReadAzure by their header.
	SourceBurstGPT Source = "BurstGPT"
)

// ParseError reports a malformed trace line. Its message reads
// "FILE:LINE: what is wrong"; Unwrap returns the underlying cause (for
// example a *strconv.NumError, a *json.SyntaxError or a sentinel such as
// ErrTimestampDecreased), so callers can use errors.Is and errors.As.
type ParseError struct {
	File string // the name passed to the reader
	Line int    // 1-based line number
	Err  error  // what is wrong
}

// Error implements error as "FILE:LINE: cause".
func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

// Unwrap returns the cause.
func (e *ParseError) Unwrap() error { return e.Err }

// Causes wrapped by *ParseError that callers may test with errors.Is.
var (
	// ErrTimestampDecreased: a request arrives before the one on the
	// previous line; both trace families are sorted by arrival.
	ErrTimestampDecreased = errors.New("timestamp decreases")
	// ErrHashIDCount: a Mooncake line's hash_ids does not hold exactly
	// ceil(input_length/512) ids.
	ErrHashIDCount = errors.New("hash_ids length does not match input_length")
	// ErrNegative: a length or timestamp is negative.
	ErrNegative = errors.New("negative value")
	// ErrDurationOverflow: a request's arrival, as an offset from the
	// first request, does not fit a time.Duration (about 292 years).
	ErrDurationOverflow = errors.New("overflows a time.Duration")
)

// ErrNoRecords is returned, wrapped as "NAME: no records", for a trace
// that holds no request: an empty or all-blank Mooncake file, or an Azure
// file with only its header. A replay of nothing is always a mistake (the
// wrong file, a truncated download), so it fails loudly like a malformed
// line. It is not wrapped in a *ParseError: no line is at fault.
var ErrNoRecords = errors.New("no records")

// ErrUnknownFormat is returned by Read and ReadFile for a name whose
// extension is neither .jsonl nor .csv, and by ReadAs and ReadFileAs for a
// Format that is neither Mooncake nor Azure. It is not wrapped in a
// *ParseError.
var ErrUnknownFormat = errors.New("unknown trace format (want .jsonl or .csv)")

// MaxLineBytes bounds one line of a trace, in bytes (16 MiB). The longest
// real Mooncake line (a 126,195-token prompt, 247 ids) is about 2 KB and an
// Azure line about 40 bytes; 16 MiB leaves room for any prompt that fits a
// 64-bit token count while bounding the memory a file without newlines
// (/dev/zero, a binary file) can take. A longer line is a *ParseError
// wrapping ErrLineTooLong.
const MaxLineBytes = 16 << 20

// ErrLineTooLong is the cause of the *ParseError for a line longer than
// MaxLineBytes; the error names the line.
var ErrLineTooLong = errors.New("line too long")

// lineTooLong is the cause for a line over MaxLineBytes, in words.
func lineTooLong() error {
	return fmt.Errorf("%w: over %d MiB, the limit for one trace line", ErrLineTooLong, MaxLineBytes>>20)
}

// Format is a trace file format, named as the extension it is read by.
type Format string

const (
	// Mooncake is the Mooncake JSON lines format (.jsonl), read by
	// ReadMooncake.
	Mooncake Format = "jsonl"
	// Azure is the CSV format (.csv), read by ReadAzure: the Azure LLM
	// inference traces (2023 and 2024) and the BurstGPT traces, told apart
	// by their header.
	Azure Format = "csv"
)

// describe words the format for messages.
func (f Format) describe() string {
	switch f {
	case Mooncake:
		return "JSON lines (a Mooncake trace)"
	case Azure:
		return "CSV (an Azure or BurstGPT trace)"
	default:
		return string(f)
	}
}

// FormatOf returns the format named by path's extension (case-insensitive):
// Mooncake for ".jsonl", Azure for ".csv", "" for any other.
func FormatOf(path string) Format {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl":
		return Mooncake
	case ".csv":
		return Azure
	default:
		return ""
	}
}

// FormatError is the cause of the *ParseError for an input that plainly
// is in the other format: JSON lines read as an Azure CSV, or a CSV read
// as Mooncake JSON lines (a file with the wrong extension, say).
type FormatError struct {
	Read  Format // the format the input was read as
	Looks Format // the format it looks like
}

// Error implements error as "looks like JSON lines (a Mooncake trace), not
// CSV (an Azure or BurstGPT trace)".
func (e *FormatError) Error() string {
	return fmt.Sprintf("looks like %s, not %s", e.Looks.describe(), e.Read.describe())
}

// Compression is a compressed file format a trace may be shipped in.
type Compression struct {
	Name         string // "gzip"
	Ext          string // its usual file extension, ".gz"
	Decompressor string // the usual command that writes it decompressed to stdout, "zcat"
	magic        string // the bytes its streams start with
}

// Compressions are the compressed formats the readers recognise by their
// first bytes (and the command line by extension): gzip, zstd, bzip2, xz.
var Compressions = []Compression{
	{Name: "gzip", Ext: ".gz", Decompressor: "zcat", magic: "\x1f\x8b"},
	{Name: "zstd", Ext: ".zst", Decompressor: "zstdcat", magic: "\x28\xb5\x2f\xfd"},
	{Name: "bzip2", Ext: ".bz2", Decompressor: "bzcat", magic: "BZh"},
	{Name: "xz", Ext: ".xz", Decompressor: "xzcat", magic: "\xfd7zXZ\x00"},
}

// CompressedError is the cause of the *ParseError (line 1) for an input
// that starts with a compressed stream (one of Compressions): the readers
// take text, so it must be decompressed first.
type CompressedError struct {
	Compression
}

// Error implements error as "compressed with gzip, not a text trace".
func (e *CompressedError) Error() string {
	return "compressed with " + e.Name + ", not a text trace"
}

// compressed returns a *CompressedError when br starts with the magic
// bytes of one of Compressions, else nil.
func compressed(br *bufio.Reader) error {
	b, _ := br.Peek(8)
	for _, c := range Compressions {
		if strings.HasPrefix(string(b), c.magic) {
			return &CompressedError{Compression: c}
		}
	}
	return nil
}

// utf8BOM is the byte order mark some tools (spreadsheet programs saving
// "CSV UTF-8", editors on Windows) write at the start of a UTF-8 file.
const utf8BOM = "\xef\xbb\xbf"

// skipBOM discards a UTF-8 byte order mark at the start of br, so that a
// trace saved with one reads as the same trace without it.
func skipBOM(br *bufio.Reader) {
	if b, _ := br.Peek(len(utf8BOM)); string(b) == utf8BOM {
		_, _ = br.Discard(len(utf8BOM))
	}
}

// Read parses a trace, choosing the format from name's extension
// (FormatOf): ".jsonl" is read with ReadMooncake and ".csv" with
// ReadAzure. Any other extension yields an error wrapping ErrUnknownFormat.
// name is used only for the extension and in error messages.
func Read(r io.Reader, name string) ([]Record, error) {
	return ReadAs(r, name, FormatOf(name))
}

// ReadAs parses a trace in format f, whatever name's extension; name is
// used in error messages only. A Format other than Mooncake and Azure
// yields an error wrapping ErrUnknownFormat.
func ReadAs(r io.Reader, name string, f Format) ([]Record, error) {
	switch f {
	case Mooncake:
		return ReadMooncake(r, name)
	case Azure:
		return ReadAzure(r, name)
	default:
		return nil, fmt.Errorf("%s: %w", name, ErrUnknownFormat)
	}
}

// ReadFile opens path and parses it with Read, using path as the name in
// error messages; see ReadFileAs.
func ReadFile(path string) ([]Record, error) {
	return ReadFileAs(path, FormatOf(path))
}

// ReadFileAs opens path and parses it with ReadAs in format f, using path
// as the name in error messages. path must be a regular file (symbolic
// links are followed): a named pipe, a device or a directory is refused
// with an error wrapping inputfile.ErrNotRegular, so that a pipe with no
// writer cannot block the open. Open errors are returned as they are (a
// read error in the middle of the file is wrapped in a *ParseError).
func ReadFileAs(path string, f Format) ([]Record, error) {
	file, err := inputfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return ReadAs(file, path, f)
}

// Records reads a trace in format f record by record, for a caller that
// needs one record at a time (a long replay): each record, with a nil
// error, as soon as its line is parsed, so memory is one line whatever the
// trace's length. Records and their checks are exactly ReadAs's; the
// first error ReadAs would return (a *ParseError naming the line,
// ErrNoRecords, ErrUnknownFormat) is yielded once, with a nil record,
// after the records before it, and ends the sequence. Each record is a
// new one, the caller's to keep. r is read once: range over the sequence
// once.
func Records(r io.Reader, name string, f Format) iter.Seq2[*Record, error] {
	return func(yield func(*Record, error) bool) {
		var scan func(io.Reader, string, func(*Record) bool) error
		switch f {
		case Mooncake:
			scan = scanMooncake
		case Azure:
			scan = scanAzure
		default:
			yield(nil, fmt.Errorf("%s: %w", name, ErrUnknownFormat))
			return
		}
		stopped := false
		err := scan(r, name, func(rec *Record) bool {
			stopped = !yield(rec, nil)
			return !stopped
		})
		if err != nil && !stopped {
			yield(nil, err)
		}
	}
}

// FileRecords is Records over the file at path, in format f: each range
// over the sequence opens path (as ReadFileAs does, refusing what is not
// a regular file) and reads it from its start, closing it when the range
// ends; an open error is yielded like a parse error. path names the file
// in error messages.
func FileRecords(path string, f Format) iter.Seq2[*Record, error] {
	return func(yield func(*Record, error) bool) {
		file, err := inputfile.Open(path)
		if err != nil {
			yield(nil, err)
			return
		}
		defer file.Close()
		for rec, err := range Records(file, path, f) {
			if !yield(rec, err) {
				return
			}
		}
	}
}

// collect gathers the records scan hands over into a slice, or returns
// its error.
func collect(scan func(yield func(*Record) bool) error) ([]Record, error) {
	var recs []Record
	if err := scan(func(rec *Record) bool {
		recs = append(recs, *rec)
		return true
	}); err != nil {
		return nil, err
	}
	return recs, nil
}
