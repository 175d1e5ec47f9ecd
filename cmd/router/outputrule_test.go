package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		"JSON report":      writeFile(t, "r.json", `{"policy": "default", "trace": "t.jsonl", "requests": 5}`),
		"HTML report":      writeFile(t, "r.html", "<!DOCTYPE html>\n<html></html>\n"),
		"per-request":      writeFile(t, "r.jsonl", `{"index":0,"arrival_ms":0,"worker":1}`+"\n"),
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

// TestHoldsKind checks the content rule on real outputs and near misses.
func TestHoldsKind(t *testing.T) {
	for _, tt := range []struct {
		name string
		head string
		kind outputKind
		want bool
	}{
		{"report object", "{\n  \"policy\": \"default\",\n  \"role_policies\": {\"aggregated\": \"default\"},\n  \"trace\": \"t\"\n}", kindReport, true},
		{"report array", `[{"policy": "a", "trace": "t"}, {"policy": "b", "trace": "t"}]`, kindReport, true},
		{"empty report array", " [ ] ", kindReport, true},
		{"HCL JSON policy", `{"router": {}, "policy": {"p": {}}, "trace": "x"}`, kindReport, false},
		{"report without trace", `{"policy": "a"}`, kindReport, false},
		{"workers file", "worker \"a\" {\n  url = \"http://x\"\n}\n", kindReport, false},
		{"html", "\ufeff\n<!doctype HTML>\n<html>", kindHTML, true},
		{"html fragment", "<html><body>", kindHTML, false},
		{"per-request", `{"index":0,"arrival_ms":0,"worker":2}` + "\n", kindPerRequest, true},
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
