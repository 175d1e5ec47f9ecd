package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	policyDir = "../../examples/policies"
	traceDir  = "../../testdata/traces"
)

var (
	kvPolicy = filepath.Join(policyDir, "kv.hcl")
	rrPolicy = filepath.Join(policyDir, "round-robin.hcl")
)

// routerRun runs the CLI in-process and returns its exit code and output.
func routerRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// writeFile writes content to name in a fresh temporary directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidateOK(t *testing.T) {
	shadowPolicy := filepath.Join(t.TempDir(), "shadow.hcl")
	if err := os.WriteFile(shadowPolicy, []byte(`policy "live" {
  scorer "cost" { type = "kv-cost" }
  picker "pick" { type = "min-cost" }
  shadow = "trial"
}
policy "trial" {
  picker "pick" { type = "least-loaded" }
}
worker_selection { aggregated = "live" }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	oneClass := writeFile(t, "one-class.hcl", "queue {\n  class \"a\" {\n  }\n}\nworker_selection { aggregated = \"default\" }\n")
	tests := []struct {
		file string
		want []string // lines (prefixes after trimming) stdout must contain
	}{
		{kvPolicy, []string{
			kvPolicy + `: ok (block_size 512, seed 7)`,
			`aggregated  policy "kv"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
			`scorer cost         type kv-cost        in-process  weight 1`,
			`picker pick         type min-cost       in-process`,
			`fallback "least-loaded"`,
			`prefill     policy "default"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
			`decode      policy "default"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
		}},
		{rrPolicy, []string{
			rrPolicy + `: ok (block_size 512)`,
			`aggregated  policy "rr"  [hosted, inputs none]`,
			`picker rr           type round-robin    in-process`,
			`prefill     policy "default"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
			`decode      policy "default"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
		}},
		{shadowPolicy, []string{
			shadowPolicy + `: ok (block_size 512)`,
			`aggregated  policy "live"  [pipeline, inputs LOAD|CACHE|CAPACITY]`,
			`fallback "least-loaded"`,
			`shadow "trial"`,
		}},
		{oneClass, []string{
			oneClass + `: ok (block_size 512)`,
			`queue       1 class, aging 1s, max_active_requests 0`,
		}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			code, out, errOut := routerRun(t, "validate", tt.file)
			if code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(out, "\n") {
				lines[strings.TrimSpace(l)] = true
			}
			for _, w := range tt.want {
				if !lines[w] {
					t.Errorf("stdout lacks line %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestValidateErrors(t *testing.T) {
	kv, err := os.ReadFile(kvPolicy)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := os.ReadFile(rrPolicy)
	if err != nil {
		t.Fatal(err)
	}
	replace := func(src []byte, old, new string) string {
		t.Helper()
		if !bytes.Contains(src, []byte(old)) {
			t.Fatalf("%q not in the example policy", old)
		}
		return strings.Replace(string(src), old, new, 1)
	}
	tests := []struct {
		name    string
		content string
		pos     string // LINE:COL of the error
		mention string // stderr must mention this
	}{
		// kv.hcl line 18: `    temperature = 0`; the value is column 19.
		{"negative temperature", replace(kv, "temperature = 0", "temperature = -1"), "18:19", "temperature = -1"},
		// kv.hcl line 12: `    overlap_credit        = 1.0`.
		{"unknown attribute", replace(kv, "overlap_credit        = 1.0", "bogus = 1"), "12:5", `"bogus"`},
		// kv.hcl line 14: `    decode_request_weight = 0`, made kv-cost's
		// cpu_weight over its bound of 1; the value is column 29.
		{"cpu weight over 1", replace(kv, "decode_request_weight = 0", "cpu_weight            = 1.5"), "14:29", "cpu_weight = 1.5: must be between 0 and 1"},
		// round-robin.hcl line 9: `    type = "round-robin"`; the value is column 12.
		{"unknown type", replace(rr, `"round-robin"`, `"no-such"`), "9:12", `"no-such"`},
		{"syntax error", replace(rr, "policy \"rr\" {", "policy \"rr\" {{"), "7:", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := writeFile(t, "bad.hcl", tt.content)
			code, out, errOut := routerRun(t, "validate", file)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if out != "" {
				t.Errorf("stdout %q, want none", out)
			}
			if want := file + ":" + tt.pos; !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, ": error: ") {
				t.Errorf("stderr %q, want it to start with %q and say error", errOut, want)
			}
			if !strings.Contains(errOut, tt.mention) {
				t.Errorf("stderr %q does not mention %q", errOut, tt.mention)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "missing.hcl")
		code, _, errOut := routerRun(t, "validate", file)
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if !strings.HasPrefix(errOut, file+":") || !strings.Contains(errOut, "no such file") {
			t.Errorf("stderr %q", errOut)
		}
	})
	t.Run("no argument", func(t *testing.T) {
		if code, _, _ := routerRun(t, "validate"); code != 2 {
			t.Errorf("exit %d, want 2", code)
		}
	})
}

func TestReplayTraces(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	bad := writeFile(t, "bad.jsonl", good+"\n"+good+"\n"+`{"timestamp": 1, "input_length": 1,`+"\n"+good+"\n")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr []string // substrings of stderr
	}{
		{"malformed mooncake", []string{"replay", "--trace", bad, "--limit", "10"},
			1, nil, []string{bad + ":3: "}},
		{"missing trace", []string{"replay", "--trace", filepath.Join(t.TempDir(), "none.jsonl")},
			1, nil, []string{"none.jsonl", "no such file"}},
		{"azure csv", []string{"replay", "--trace", filepath.Join(traceDir, "azure_llm_2023_code.csv"), "--limit", "200", "--workers", "2"},
			0, []string{"trace azure_llm_2023_code.csv: 200 requests on 2 simulated workers", "policy", "default", "TTFT p50"}, nil},
		{"compare with policy", []string{"replay", "--compare", rrPolicy + "," + kvPolicy, "--policy", kvPolicy, "--limit", "10"},
			2, nil, []string{"--compare", "--policy"}},
		{"zero workers", []string{"replay", "--workers", "0", "--limit", "10"},
			2, nil, []string{"--workers 0"}},
		{"negative limit", []string{"replay", "--limit", "-1"},
			2, nil, []string{"--limit -1"}},
		{"broken policy", []string{"replay", "--policy", writeFile(t, "p.hcl", "policy {"), "--limit", "10"},
			1, nil, []string{"p.hcl:1:", "policy file has errors"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := routerRun(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, errOut)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q: %q", s, errOut)
				}
			}
		})
	}
}
