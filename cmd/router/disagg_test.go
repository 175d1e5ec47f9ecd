package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runRouter runs the CLI in-process; it returns the exit code and output.
func runRouter(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayDisaggregated(t *testing.T) {
	dir := t.TempDir()
	perReq, report := filepath.Join(dir, "req.jsonl"), filepath.Join(dir, "report.json")
	arxiv := filepath.Join("..", "..", "testdata", "traces", "mooncake_arxiv_trace_first1000.jsonl")
	code, out, errOut := runRouter("replay", "--trace", arxiv, "--limit", "200", "--seed", "3",
		"--prefill-workers", "2", "--decode-workers", "3", "--per-request", perReq, "--report", report)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, s := range []string{"200 requests on 2 prefill + 3 decode simulated workers", "default(2P+3D)"} {
		if !strings.Contains(out, s) {
			t.Errorf("stdout lacks %q:\n%s", s, out)
		}
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workers           int   `json:"workers"`
		PrefillWorkers    int   `json:"prefill_workers"`
		DecodeWorkers     int   `json:"decode_workers"`
		Completed         int   `json:"completed"`
		RequestsPerWorker []int `json:"requests_per_worker"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Workers != 5 || rep.PrefillWorkers != 2 || rep.DecodeWorkers != 3 || rep.Completed != 200 || len(rep.RequestsPerWorker) != 5 {
		t.Fatalf("report %s", b)
	}
	lines, err := os.ReadFile(perReq)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(lines, []byte(`"decode_worker":`)); n != 200 {
		t.Errorf("%d per-request lines name a decode worker, want 200", n)
	}
}

func TestReplayDisaggregatedUsage(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"prefill only", []string{"--prefill-workers", "2"}, "both --prefill-workers and --decode-workers"},
		{"decode only", []string{"--decode-workers", "2"}, "both --prefill-workers and --decode-workers"},
		{"zero decode", []string{"--prefill-workers", "2", "--decode-workers", "0"}, "--decode-workers 0"},
		{"zero prefill", []string{"--prefill-workers", "0", "--decode-workers", "2"}, "--prefill-workers 0"},
		{"with workers", []string{"--workers", "8", "--prefill-workers", "1", "--decode-workers", "1"}, "--workers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runRouter(append([]string{"replay", "--limit", "10"}, tt.args...)...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, errOut, tt.want)
			}
		})
	}
}
