package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// routerRunStdin runs the CLI in-process with stdin as its standard input.
func routerRunStdin(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runIO(context.Background(), args, stdin, &out, &errb)
	return code, out.String(), errb.String()
}

// traceHead returns the first n lines of a bundled trace file.
func traceHead(t *testing.T, file string, n int) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	return strings.Join(lines[:n], "")
}

// TestReplayStdinAndStdout: --trace - reads the trace from stdin and
// --per-request - / --report - write to stdout, with the table on stderr;
// the per-request lines are byte-identical to a run on the same trace as
// a file, and no file named "-" is created.
func TestReplayStdinAndStdout(t *testing.T) {
	head := traceHead(t, arxivTrace, 100)
	t.Chdir(t.TempDir()) // a file named "-" would land here
	fromFile := filepath.Join(t.TempDir(), "requests.jsonl")
	code, _, errOut := routerRun(t, "replay", "--trace", writeFile(t, "t.jsonl", head), "--workers", "4", "--per-request", fromFile)
	if code != 0 {
		t.Fatalf("from a file: exit %d, stderr %q", code, errOut)
	}
	want, err := os.ReadFile(fromFile)
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := routerRunStdin(t, strings.NewReader(head),
		"replay", "--trace", "-", "--trace-format", "jsonl", "--workers", "4", "--per-request", "-")
	if code != 0 {
		t.Fatalf("--per-request -: exit %d, stderr %q", code, errOut)
	}
	if out != string(want) {
		t.Errorf("--per-request - wrote %d bytes to stdout, want the %d of the run from a file", len(out), len(want))
	}
	if !strings.HasPrefix(errOut, "trace stdin: 100 requests on 4 simulated workers\n") || !strings.Contains(errOut, "TTFT p50") {
		t.Errorf("stderr %q, want the table", errOut)
	}

	code, out, errOut = routerRunStdin(t, strings.NewReader(head),
		"replay", "--trace", "-", "--trace-format", "jsonl", "--workers", "4", "--report", "-")
	if code != 0 {
		t.Fatalf("--report -: exit %d, stderr %q", code, errOut)
	}
	var rep struct {
		Trace    string
		Requests int
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Trace != "stdin" || rep.Requests != 100 {
		t.Errorf("stdout %q: %+v, %v; want the JSON report of 100 requests of trace stdin", out, rep, err)
	}
	if !strings.HasPrefix(errOut, "trace stdin: 100 requests on 4 simulated workers\n") {
		t.Errorf("stderr %q, want the table", errOut)
	}
	if names := dirNames(t, "."); len(names) != 0 {
		t.Errorf("the working directory holds %q, want nothing", names)
	}
}

// TestReplayStdoutOnlyOnSuccess: like a file, standard output gets the
// report only when the whole run succeeds.
func TestReplayStdoutOnlyOnSuccess(t *testing.T) {
	bs16 := writeFile(t, "bs16.hcl", "router {\n  block_size = 16\n}\n")
	code, out, errOut := routerRun(t, "replay", "--limit", "20", "--policy", bs16, "--report", "-")
	if code != 1 || out != "" || !strings.Contains(errOut, "block_size = 512") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1, nothing and the replay's error", code, out, errOut)
	}
}

func TestReplayStreamUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"stdin without a format", []string{"--trace", "-"},
			"router: --trace - reads the trace from standard input: give its format, --trace-format jsonl or --trace-format csv\n"},
		{"unknown format", []string{"--trace", arxivTrace, "--trace-format", "json"},
			"router: --trace-format json: want jsonl (a Mooncake trace) or csv (an Azure 2023 or 2024 or a BurstGPT trace: its header tells which)\n"},
		{"empty format", []string{"--trace", arxivTrace, "--trace-format", ""},
			"router: --trace-format '': want jsonl (a Mooncake trace) or csv (an Azure 2023 or 2024 or a BurstGPT trace: its header tells which)\n"},
		{"format without a trace", []string{"--trace-format", "csv"},
			"router: --trace-format needs --trace: the bundled trace is JSON lines\n"},
		{"both outputs to stdout", []string{"--per-request", "-", "--report", "-"},
			"router: --per-request, --report and --html cannot write to standard output together: give all but one of them a file\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if errOut := wantExit(t, 2, append([]string{"replay", "--limit", "10"}, tt.args...)); errOut != tt.want {
				t.Errorf("stderr %q, want %q", errOut, tt.want)
			}
		})
	}
}

// TestReplayTraceFormat: --trace-format overrides the extension, and a
// trace in the other format than its name says is named as such, with
// what to do.
func TestReplayTraceFormat(t *testing.T) {
	azure := traceHead(t, filepath.Join(traceDir, "azure_llm_2023_code.csv"), 51)
	mooncake := traceHead(t, arxivTrace, 50)
	azureAsJSONL := writeFile(t, "azure.jsonl", azure)
	mooncakeAsCSV := writeFile(t, "mooncake.csv", mooncake)
	txt := writeFile(t, "trace.txt", mooncake)

	code, out, errOut := routerRun(t, "replay", "--trace", azureAsJSONL, "--trace-format", "csv")
	if code != 0 || !strings.HasPrefix(out, "trace azure.jsonl: 50 requests on 8 simulated workers\n") {
		t.Errorf("azure.jsonl read as csv: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = routerRun(t, "replay", "--trace", txt, "--trace-format", "jsonl")
	if code != 0 || !strings.HasPrefix(out, "trace trace.txt: 50 requests on 8 simulated workers\n") {
		t.Errorf("trace.txt read as jsonl: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	for _, tt := range []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"jsonl named csv", "", []string{"--trace", mooncakeAsCSV},
			mooncakeAsCSV + ":1: looks like JSON lines (a Mooncake trace), not CSV (an Azure or BurstGPT trace); use a .jsonl name or --trace-format jsonl"},
		{"csv named jsonl", "", []string{"--trace", azureAsJSONL},
			azureAsJSONL + ":1: looks like CSV (an Azure or BurstGPT trace), not JSON lines (a Mooncake trace); use a .csv name or --trace-format csv"},
		{"jsonl read as csv", "", []string{"--trace", txt, "--trace-format", "csv"},
			txt + ":1: looks like JSON lines (a Mooncake trace), not CSV (an Azure or BurstGPT trace); use --trace-format jsonl"},
		{"stdin csv read as jsonl", azure, []string{"--trace", "-", "--trace-format", "jsonl"},
			"stdin:1: looks like CSV (an Azure or BurstGPT trace), not JSON lines (a Mooncake trace); use --trace-format csv"},
		{"unknown extension", "", []string{"--trace", txt},
			txt + ": unknown trace format (want .jsonl or .csv); or give --trace-format jsonl or --trace-format csv"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := routerRunStdin(t, strings.NewReader(tt.stdin), append([]string{"replay"}, tt.args...)...)
			if want := "router: " + tt.want + "\n"; code != 1 || out != "" || errOut != want {
				t.Errorf("exit %d, stdout %q, stderr\n%q\nwant exit 1, stderr\n%q", code, out, errOut, want)
			}
		})
	}
}

// TestReplayCompressedTrace: a gzip-compressed trace is named compressed
// with how to replay it (decompressed into --trace -), by its .gz name
// before it is read and by its bytes whatever its name. It was taken for
// CSV ("looks like CSV (an Azure or BurstGPT trace)... use --trace-format csv").
func TestReplayCompressedTrace(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write([]byte(traceHead(t, arxivTrace, 50))); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	dotGz := writeFile(t, "t.jsonl.gz", gz.String())
	asJSONL := writeFile(t, "gz.jsonl", gz.String())
	asCSV := writeFile(t, "gz.csv", gz.String())
	for _, tt := range []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"by extension", "", []string{"--trace", dotGz},
			dotGz + ": a compressed trace; decompress it into standard input: zcat " + dotGz + " | router replay --trace - --trace-format jsonl"},
		{"by extension, format given", "", []string{"--trace", dotGz, "--trace-format", "jsonl"},
			dotGz + ":1: compressed with gzip, not a text trace; decompress it into standard input: zcat " + dotGz + " | router replay --trace - --trace-format jsonl"},
		{"named jsonl", "", []string{"--trace", asJSONL},
			asJSONL + ":1: compressed with gzip, not a text trace; decompress it into standard input: zcat " + asJSONL + " | router replay --trace - --trace-format jsonl"},
		{"named csv", "", []string{"--trace", asCSV},
			asCSV + ":1: compressed with gzip, not a text trace; decompress it into standard input: zcat " + asCSV + " | router replay --trace - --trace-format csv"},
		{"stdin", gz.String(), []string{"--trace", "-", "--trace-format", "jsonl"},
			"stdin:1: compressed with gzip, not a text trace; decompress it before the router reads it: ... | zcat | router replay --trace - --trace-format jsonl"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := routerRunStdin(t, strings.NewReader(tt.stdin), append([]string{"replay"}, tt.args...)...)
			if want := "router: " + tt.want + "\n"; code != 1 || out != "" || errOut != want {
				t.Errorf("exit %d, stdout %q, stderr\n%q\nwant exit 1, stderr\n%q", code, out, errOut, want)
			}
		})
	}
}

// TestReplayLineTooLong: a trace line over the limit is named with its
// line number, in words (it was "bufio.Scanner: token too long").
func TestReplayLineTooLong(t *testing.T) {
	head := traceHead(t, arxivTrace, 2)
	long := strings.Repeat(" ", 16<<20+1)
	for _, tt := range []struct{ name, content string }{
		{"t.jsonl", head + long + "\n"},
		{"t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n" + long},
	} {
		file := writeFile(t, tt.name, tt.content)
		want := "router: " + file + ":3: line too long: over 16 MiB, the limit for one trace line\n"
		if errOut := wantExit(t, 1, []string{"replay", "--trace", file}); errOut != want {
			t.Errorf("stderr %q, want %q", errOut, want)
		}
	}
}

// TestReplayNoPrefixHashesNote: a trace without prefix hashes (Azure)
// gets one note on stderr, also when several policies are compared, and
// none in stdout; a Mooncake trace gets none.
func TestReplayNoPrefixHashesNote(t *testing.T) {
	azure := filepath.Join(traceDir, "azure_llm_2023_conv.csv")
	const note = "router: note: trace azure_llm_2023_conv.csv has no prefix hashes (Azure 2023 traces have token counts only): " +
		"KV-aware policies (those reading CACHE, such as the default kv-affinity) cannot use prefix reuse on it, and KV hit is 0%\n"
	code, out, errOut := routerRun(t, "replay", "--trace", azure, "--limit", "50", "--compare", rrPolicy+","+kvPolicy)
	if code != 0 || errOut != note || strings.Contains(out, "note") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0 and stderr %q alone", code, out, errOut, note)
	}
	code, _, errOut = routerRun(t, "replay", "--trace", arxivTrace, "--limit", "50")
	if code != 0 || strings.Contains(errOut, "no prefix hashes") {
		t.Errorf("Mooncake trace: exit %d, stderr %q; want no note", code, errOut)
	}
}

// TestFlagValuesInWords: every flag of every subcommand whose value can
// fail to parse answers a bad value with the flag, the value and what it
// accepts, not strconv's or time's message; each numeric flag says its
// own range. The usage error exits 2.
func TestFlagValuesInWords(t *testing.T) {
	bad := map[string][]string{ // pflag type -> values that do not parse
		"int":         {"x", "1.5", "99999999999999999999"},
		"int64":       {"x", "99999999999999999999"},
		"float64":     {"x", "1e999"},
		"duration":    {"5", "x"},
		"bool":        {"maybe"},
		"stringSlice": {`a,"b`},
	}
	numeric := map[string]bool{"int": true, "int64": true, "float64": true, "duration": true}
	checked := 0
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		path := strings.Fields(cmd.CommandPath())[1:] // without "router"
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			typ := f.Value.Type()
			want := f.Annotations[wantAnnotation]
			if numeric[typ] && len(want) == 0 {
				t.Errorf("%s --%s (%s) has no wantAnnotation: say its range with setWant", cmd.CommandPath(), f.Name, typ)
			}
			for _, v := range bad[typ] {
				w := typeWant(typ)
				if len(want) > 0 {
					w = want[0]
				}
				what := ""
				if v == "99999999999999999999" || v == "1e999" {
					what = "out of range; "
				}
				wantErr := "router: --" + f.Name + " " + v + ": " + what + "want " + w + "\n"
				args := append(append([]string{}, path...), "--"+f.Name+"="+v)
				code, out, errOut := routerRun(t, args...)
				if code != 2 || out != "" || errOut != wantErr {
					t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", args, code, out, errOut, wantErr)
				}
				checked++
			}
		})
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(newRootCmd(io.Discard, io.Discard))
	// replay has 5 numeric flags and --compare, serve 3 and --watch,
	// mock-worker 3, plugins describe 1.
	if checked < 30 {
		t.Errorf("%d bad values checked; the walk missed flags", checked)
	}
}

// TestFlagRanges: values that parse but are out of a flag's range get the
// same words as those that do not parse.
func TestFlagRanges(t *testing.T) {
	const positive = "a duration greater than 0 with a unit, such as 500ms, 30s, 5m or 1h30m (at most 2562047h)"
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"mock-worker", "--kv-blocks", "0"}, "--kv-blocks 0: want a whole number from 1 to 2147483647"},
		{[]string{"mock-worker", "--kv-blocks", "99999999999"}, "--kv-blocks 99999999999: want a whole number from 1 to 2147483647"},
		{[]string{"mock-worker", "--engine-block-size", "0"}, "--engine-block-size 0: want a whole number from 1 to 65536"},
		{[]string{"mock-worker", "--block-size", "70000"}, "--block-size 70000: want a whole number from 1 to 65536"},
		{[]string{"mock-worker", "--speedup", "+Inf"}, "--speedup +Inf: want a finite number greater than 0"},
		{[]string{"mock-worker", "--speedup", "NaN"}, "--speedup NaN: want a finite number greater than 0"},
		{[]string{"mock-worker", "--data-parallel-size", "65"}, "--data-parallel-size 65: want a whole number from 1 to 64"},
		{[]string{"serve", "--policy", rrPolicy, "--request-timeout", "0s"}, "--request-timeout 0s: want " + positive},
		{[]string{"serve", "--policy", rrPolicy, "--drain-timeout", "-1s"}, "--drain-timeout -1s: want " + positive},
		{[]string{"serve", "--policy", rrPolicy, "--chars-per-token", "0"}, "--chars-per-token 0: want a whole number from 1 to 9223372036854775807"},
		{[]string{"serve", "--policy", rrPolicy, "--shadow-max-inflight", "0"}, "--shadow-max-inflight 0: want a whole number from 1 to 4096"},
		{[]string{"plugins", "describe", "--start-timeout", "0s", "x"}, "--start-timeout 0s: want " + positive},
		{[]string{"epp", "--policy", rrPolicy, "--fallbacks", "9"}, "--fallbacks 9: want a whole number from 0 to 8"},
		{[]string{"epp", "--policy", rrPolicy, "--fallbacks", "-1"}, "--fallbacks -1: want a whole number from 0 to 8"},
		{[]string{"epp", "--policy", rrPolicy, "--request-timeout", "0s"}, "--request-timeout 0s: want " + positive},
		{[]string{"epp", "--policy", rrPolicy, "--chars-per-token", "0"}, "--chars-per-token 0: want a whole number from 1 to 9223372036854775807"},
	} {
		args := append(tt.args, "--listen", "127.0.0.1:0")
		if tt.args[0] == "plugins" {
			args = tt.args
		}
		// A cancelled context: a case that wrongly starts serving stops at once.
		var out, errb bytes.Buffer
		if code := runContext(canceled(), args, &out, &errb); code != 2 || errb.String() != "router: "+tt.want+"\n" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), "router: "+tt.want+"\n")
		}
	}
}

// TestArgumentsInWords: a wrong number of arguments, and an address that
// cannot be listened on, are answered naming the command or the flag.
func TestArgumentsInWords(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"validate"}, 2, "router: validate takes the policy file to check; see 'router validate --help'\n"},
		{[]string{"validate", "a.hcl", "b.hcl"}, 2, "router: validate takes one policy file, got 2: [\"a.hcl\" \"b.hcl\"]\n"},
		{[]string{"plugins", "describe"}, 2,
			"router: plugins describe takes a plugin binary to start (and its arguments), or --policy FILE --plugin NAME; see 'router plugins describe --help'\n"},
		// The command is named once, after main's "router: " (not
		// "router: router version ...").
		{[]string{"version", "x"}, 2, "router: version takes no arguments, got [\"x\"]; see 'router version --help'\n"},
		{[]string{"mock-worker", "--listen", "nohost"}, 1, "router: --listen nohost: listen tcp: address nohost: missing port in address\n"},
		{[]string{"serve", "--policy", rrPolicy, "--listen", "nohost"}, 1, "router: --listen nohost: listen tcp: address nohost: missing port in address\n"},
		// A directory is not a stream: no hint to pipe it.
		{[]string{"replay", "--trace", dir}, 1, "router: " + dir + " is a directory, not a regular file\n"},
	} {
		var out, errb bytes.Buffer
		// serve may log before it listens: the message is the last line.
		if code := runContext(canceled(), tt.args, &out, &errb); code != tt.code || !strings.HasSuffix(errb.String(), tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and a stderr ending in %q", tt.args, code, errb.String(), tt.code, tt.want)
		}
	}
}
