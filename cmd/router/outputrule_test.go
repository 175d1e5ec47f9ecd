package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/report"
)

// outputFlag is one output flag of one subcommand, with the arguments of a
// short run that writes it.
type outputFlag struct {
	name string   // the subcommand and flag, for the subtest
	flag string   // the flag, as messages name it
	args []string // the run, without the flag
	// rerun are arguments that change the output of args' run.
	rerun []string
}

// outputFlags are every output flag of the router's subcommands (grep
// cmd/router for createOutput).
var outputFlags = []outputFlag{
	{"replay per-request", "--per-request", []string{"replay", "--quiet", "--trace", arxivTrace, "--limit", "5", "--workers", "2"}, []string{"--limit", "6"}},
	{"replay report", "--report", []string{"replay", "--quiet", "--trace", arxivTrace, "--limit", "5", "--workers", "2"}, []string{"--limit", "6"}},
	{"replay html", "--html", []string{"replay", "--quiet", "--trace", arxivTrace, "--limit", "5", "--workers", "2"}, []string{"--limit", "6"}},
	{"trace generate", "--out", []string{"trace", "generate", "--requests", "5"}, []string{"--requests", "6"}},
}

// run runs the subcommand with its flag naming path, and extra arguments.
func (o outputFlag) run(t *testing.T, path string, extra ...string) (int, string) {
	t.Helper()
	args := append(append(append([]string(nil), o.args...), o.flag, path), extra...)
	code, _, errOut := routerRun(t, args...)
	return code, errOut
}

// copyTo copies the file src into dir under name and returns its path.
func copyTo(t *testing.T, dir, name, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOutputRule checks, for every output flag, that no output replaces a
// trace, a policy file (HCL or HCL's JSON syntax), a workers file or a
// file of another output kind, each by content, with the file unchanged
// byte for byte and the error naming the flag and the file.
func TestOutputRule(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"mooncake trace":   copyTo(t, dir, "trace.jsonl", arxivTrace),
		"generated trace":  copyTo(t, dir, "synthetic.jsonl", filepath.Join(traceDir, "synthetic_sessions.jsonl")),
		"azure trace":      copyTo(t, dir, "azure.csv", filepath.Join(traceDir, "azure_llm_2023_code.csv")),
		"policy file":      copyTo(t, dir, "policy.hcl", kvPolicy),
		"JSON policy file": copyTo(t, dir, "policy.hcl.json", "../../router/config/testdata/full.hcl.json"),
		"gzipped trace":    copyTo(t, dir, "trace.jsonl.gz", "../../router/trace/bundled/mooncake_conversation_trace.jsonl.gz"),
		"workers file":     writeFile(t, "workers.hcl", "worker \"a\" {\n  url = \"http://127.0.0.1:8000\"\n}\n"),
		"JSON report":      writeFile(t, "r.json", ownReport),
		"HTML report":      writeFile(t, "r.html", ownHTML),
		"per-request":      writeFile(t, "r.jsonl", ownPerRequest),
		// Hand-made look-alikes of the outputs, which no flag replaces.
		"hand-made HTML":       writeFile(t, "notes.html", handHTML),
		"hand-made JSON":       writeFile(t, "mine.json", handReport),
		"hand-made JSON lines": writeFile(t, "mine.jsonl", handPerRequest),
	}
	// own is the file each flag may replace: its own kind.
	own := map[string]string{"--per-request": "per-request", "--report": "JSON report", "--html": "HTML report", "--out": "generated trace"}
	for _, o := range outputFlags {
		for what, path := range files {
			if what == own[o.flag] {
				continue
			}
			t.Run(o.name+"/"+what, func(t *testing.T) {
				before, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				code, errOut := o.run(t, path)
				if code != 1 {
					t.Errorf("exit %d, want 1; stderr %q", code, errOut)
				}
				if want := o.flag + " " + path + ": the file exists and is not "; !strings.Contains(errOut, want) {
					t.Errorf("stderr %q, want %q", errOut, want)
				}
				if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
					t.Errorf("%s changed (%v)", path, err)
				}
			})
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 6 {
		t.Errorf("directory holds %d entries (%v), want the 6 files and no temporary", len(ents), err)
	}
}

// The outputs' own shapes, as the router writes them (their marker or
// members), and hand-made files that look like them but lack the marker or
// some members: a user's notes page, summary and data lines.
const (
	ownReport      = `{"policy": "default", "trace": "t.jsonl", "workers": 2, "requests": 5, "completed": 5, "rejected": 0, "ttft_ms": {"p50": 1}}`
	ownHTML        = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"generator\" content=\"switchyard router replay\">\n</head>\n<body></body></html>\n"
	ownPerRequest  = `{"index":0,"arrival_ms":0,"worker":1,"input_length":5,"output_length":2,"overlap_blocks":0,"cached_tokens":0,"queue_ms":0,"ttft_ms":3,"e2e_ms":9,"status":"ok"}` + "\n"
	handHTML       = "<!DOCTYPE html>\n<html><head><title>notes</title></head><body>my notes</body></html>\n"
	handReport     = `{"policy":"mine","trace":"x","notes":"..."}`
	handPerRequest = `{"index":0,"arrival_ms":1,"my":"data"}` + "\n"
)

// TestOutputShippedTraces checks that no output flag replaces a trace the
// repository ships (every file testdata/traces/SHA256SUMS lists), however
// it is named: by its path, through "..", by a symbolic link to it and by
// a hard link to it. Each is a usage error before any work, and the file
// is left byte for byte as it was.
func TestOutputShippedTraces(t *testing.T) {
	sums, err := os.ReadFile(filepath.Join(traceDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(sums)) {
		if f := strings.Fields(line); len(f) == 2 {
			names = append(names, f[1])
		}
	}
	if len(names) != 5 {
		t.Fatalf("SHA256SUMS lists %d files, want the 5 shipped traces: %q", len(names), names)
	}
	// The links live in the checkout, where a hard link to its files can
	// be made (a temporary directory may be another file system).
	links, err := os.MkdirTemp("../..", ".outputrule-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(links) })
	// The replays read a copy of a trace, so that no output is their input.
	input := copyTo(t, t.TempDir(), "input.jsonl", arxivTrace)
	flags := append([]outputFlag(nil), outputFlags...)
	for i := range flags {
		flags[i].args = append([]string(nil), flags[i].args...)
		for j, a := range flags[i].args {
			if a == arxivTrace {
				flags[i].args[j] = input
			}
		}
	}
	for _, name := range names {
		path := filepath.Join(traceDir, name)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			t.Fatal(err)
		}
		sym := filepath.Join(links, "sym-"+name)
		hard := filepath.Join(links, "hard-"+name)
		if err := os.Symlink(abs, sym); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(path, hard); err != nil {
			t.Fatal(err)
		}
		// The bundled default trace's source has its own message.
		what := " is a trace the repository ships, listed in testdata/traces/SHA256SUMS"
		if name == "mooncake_conversation_trace.jsonl" {
			what = " is the file the bundled default trace was built from"
		}
		for _, o := range flags {
			for _, p := range []string{path, "../../cmd/../testdata/traces/" + name, sym, hard} {
				t.Run(o.name+"/"+p, func(t *testing.T) {
					code, errOut := o.run(t, p)
					if code != 2 {
						t.Errorf("exit %d, want 2; stderr %q", code, errOut)
					}
					if want := o.flag + " " + p + what; !strings.Contains(errOut, want) {
						t.Errorf("stderr %q, want %q", errOut, want)
					}
					if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
						t.Fatalf("%s changed (%v)", path, err)
					}
				})
			}
		}
	}
	// The user's trial: trace generate onto the shipped synthetic trace.
	code, errOut := outputFlags[3].run(t, filepath.Join(traceDir, "synthetic_sessions.jsonl"), "--seed", "2")
	if code != 2 || !strings.Contains(errOut, "choose another output file") {
		t.Errorf("trace generate --seed 2 onto the shipped trace: exit %d, stderr %q", code, errOut)
	}
}

// TestOutputPipeSuggestsDash checks that every output flag naming a pipe
// by path (/dev/stdout when standard output is piped; here the pipe's
// /proc/self/fd link) is refused with a message suggesting "-".
func TestOutputPipeSuggestsDash(t *testing.T) {
	path := pipePath(t)
	for _, o := range outputFlags {
		t.Run(o.name, func(t *testing.T) {
			code, errOut := o.run(t, path)
			want := o.flag + " " + path + ": not a regular file (outputs are written to a temporary file and renamed over the target); for standard output use " + o.flag + " -"
			if code == 0 || !strings.Contains(errOut, want) {
				t.Errorf("exit %d, stderr %q; want %q", code, errOut, want)
			}
		})
	}
}

// TestOutputRerunReplacesOwnOutput checks that every output flag replaces
// its own earlier output: a rerun with other arguments writes the new
// content in place of the old.
func TestOutputRerunReplacesOwnOutput(t *testing.T) {
	for _, o := range outputFlags {
		t.Run(o.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			if code, errOut := o.run(t, path); code != 0 {
				t.Fatalf("first run: exit %d, stderr %q", code, errOut)
			}
			first, err := os.ReadFile(path)
			if err != nil || len(first) == 0 {
				t.Fatalf("first run wrote %d bytes (%v)", len(first), err)
			}
			code, errOut := o.run(t, path, o.rerun...)
			if code != 0 {
				t.Fatalf("rerun: exit %d, stderr %q", code, errOut)
			}
			second, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(first, second) {
				t.Errorf("rerun with %q left the output as it was: not replaced", o.rerun)
			}
		})
	}
}

// TestOutputIsInputOrBundledSource checks the identity rule: an output
// naming an input of the run, or the repository file the bundled trace was
// built from, is a usage error before any work, even when the file's
// content would be replaceable (an empty file).
func TestOutputIsInputOrBundledSource(t *testing.T) {
	// The repository's own bundled trace, from cmd/router: found through
	// the module root above the working directory.
	bundledSrc := filepath.Join(traceDir, "mooncake_conversation_trace.jsonl")
	bundledGz := "../../router/trace/bundled/mooncake_conversation_trace.jsonl.gz"
	for _, o := range outputFlags {
		for _, p := range []string{bundledSrc, bundledGz} {
			t.Run(o.name+"/"+filepath.Base(p), func(t *testing.T) {
				before, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				code, errOut := o.run(t, p)
				if code != 2 {
					t.Errorf("exit %d, want 2; stderr %q", code, errOut)
				}
				if want := o.flag + " " + p + " is the file the bundled default trace was built from"; !strings.Contains(errOut, want) {
					t.Errorf("stderr %q, want %q", errOut, want)
				}
				if after, err := os.ReadFile(p); err != nil || !bytes.Equal(after, before) {
					t.Fatalf("%s changed (%v)", p, err)
				}
			})
		}
	}

	// An empty input: its content passes the content check, its identity
	// does not.
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.hcl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, o := range outputFlags[:3] {
		t.Run(o.name+"/empty policy input", func(t *testing.T) {
			code, errOut := o.run(t, empty, "--policy", empty)
			if want := o.flag + " " + empty + " is the --policy input " + empty; code != 2 || !strings.Contains(errOut, want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut, want)
			}
		})
	}
	t.Run("report and html on one file", func(t *testing.T) {
		out := filepath.Join(dir, "out")
		code, errOut := outputFlags[1].run(t, out, "--html", filepath.Join(dir, ".", "out"))
		if want := "--report " + out + " and --html " + filepath.Join(dir, "out") + " are the same file"; code != 2 || !strings.Contains(errOut, want) {
			t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut, want)
		}
	})
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 {
		t.Errorf("directory holds %d entries (%v), want only the input", len(ents), err)
	}
	if b, err := os.ReadFile(empty); err != nil || len(b) != 0 {
		t.Errorf("empty input now holds %q (%v)", b, err)
	}
}

// TestOutputBundledSourceInOtherCheckout checks that the bundled trace's
// source is found in a checkout of the module above the working directory,
// by the module declared in its go.mod, and protected even empty.
func TestOutputBundledSourceInOtherCheckout(t *testing.T) {
	root := t.TempDir()
	src := filepath.Join(root, "testdata", "traces", "mooncake_conversation_trace.jsonl")
	sub := filepath.Join(root, "docs", "deep")
	for _, d := range []string{filepath.Dir(src), sub} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(src, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(arxivTrace)
	if err != nil {
		t.Fatal(err)
	}
	o := outputFlags[1]
	o.args = []string{"replay", "--quiet", "--trace", abs, "--limit", "5", "--workers", "2"}
	rel := "../../testdata/traces/mooncake_conversation_trace.jsonl"
	t.Chdir(sub)
	// Not a checkout of this module: the empty file is no bundled source.
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, errOut := o.run(t, rel); code != 0 {
		t.Fatalf("outside a checkout: exit %d, stderr %q", code, errOut)
	}
	if err := os.WriteFile(src, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module "+modulePath+"\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, errOut := o.run(t, rel)
	if want := "--report " + rel + " is the file the bundled default trace was built from"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut, want)
	}
	if b, err := os.ReadFile(src); err != nil || len(b) != 0 {
		t.Errorf("bundled source now holds %d bytes (%v)", len(b), err)
	}
}

// bigSpeedsReport is a JSON report as the router writes it (indented) for
// the largest fleet, replay.MaxWorkers workers of distinct speeds, whose
// "speeds" precede "requests": its members must lie within sniffLimit.
func bigSpeedsReport(t *testing.T) string {
	t.Helper()
	r := report.Report{Policy: "default", Trace: "t.jsonl", Workers: replay.MaxWorkers, Requests: 5, Completed: 5}
	for i := range replay.MaxWorkers {
		r.Speeds = append(r.Speeds, 1/(3+float64(i)*1.000000001))
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(b, []byte(`"rejected"`)); i < 64<<10 || i > sniffLimit {
		t.Fatalf(`"rejected" at byte %d, want past 64 KiB and within sniffLimit %d`, i, sniffLimit)
	}
	return string(b)
}

// TestHoldsKind checks the content rule on real outputs and near misses.
func TestHoldsKind(t *testing.T) {
	for _, tt := range []struct {
		name string
		head string
		kind outputKind
		want bool
	}{
		{"report object", "{\n  \"policy\": \"default\",\n  \"role_policies\": {\"aggregated\": \"default\"},\n  \"trace\": \"t\",\n  \"workers\": 2,\n  \"requests\": 5,\n  \"completed\": 4,\n  \"rejected\": 1\n}", kindReport, true},
		{"report array", `[` + ownReport + `, {"policy": "b", "trace": "t"}]`, kindReport, true},
		{"report with 4096 speeds", bigSpeedsReport(t), kindReport, true},
		{"hand-made report", handReport, kindReport, false},
		{"report array of hand-made", `[` + handReport + `]`, kindReport, false},
		{"report with a string count", `{"policy": "a", "trace": "t", "workers": "2", "requests": 5, "completed": 5, "rejected": 0}`, kindReport, false},
		{"empty report array", " [ ] ", kindReport, true},
		{"HCL JSON policy", `{"router": {}, "policy": {"p": {}}, "trace": "x"}`, kindReport, false},
		{"report without trace", `{"policy": "a"}`, kindReport, false},
		{"workers file", "worker \"a\" {\n  url = \"http://x\"\n}\n", kindReport, false},
		{"html", "\ufeff\n<!doctype HTML>\n<html><head>" + generatorMeta, kindHTML, true},
		{"html report", ownHTML, kindHTML, true},
		{"html without the marker", "<!DOCTYPE html>\n<html></html>\n", kindHTML, false},
		{"hand-made html", handHTML, kindHTML, false},
		{"marker in the body", "<!DOCTYPE html><html><head></head><body>" + generatorMeta, kindHTML, false},
		{"marker without doctype", "<html><head>" + generatorMeta, kindHTML, false},
		{"html fragment", "<html><body>", kindHTML, false},
		{"per-request", ownPerRequest, kindPerRequest, true},
		{"hand-made per-request", handPerRequest, kindPerRequest, false},
		{"old per-request subset", `{"index":0,"arrival_ms":0,"worker":2}` + "\n", kindPerRequest, false},
		{"mooncake as per-request", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n", kindPerRequest, false},
		{"generated trace", `{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1, 2], "session_id": "s12"}` + "\n", kindGeneratedTrace, true},
		{"mooncake trace", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n", kindGeneratedTrace, false},
		{"other session ids", `{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1], "session_id": "user-7"}`, kindGeneratedTrace, false},
		{"extra member", `{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1], "session_id": "s1", "x": 1}`, kindGeneratedTrace, false},
	} {
		if got := holdsKind([]byte(tt.head), tt.kind); got != tt.want {
			t.Errorf("%s: holdsKind(%s) = %v, want %v", tt.name, tt.kind, got, tt.want)
		}
	}
}
