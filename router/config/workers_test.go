package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

const workersSrc = `worker "a" {
  url             = "http://127.0.0.1:8001/"
  models          = ["llama", "qwen"]
  total_kv_blocks = 4096
}
worker "b" {
  url             = "http://127.0.0.1:8002/v1base"
  role            = "decode"
  models          = ["llama"]
  total_kv_blocks = 10
  metrics_url     = "http://127.0.0.1:9002/m"
  labels          = { zone = "eu-1", "example.com/gpu" = "h100", empty = "" }
}
`

var wantWorkers = []Worker{
	{Name: "a", URL: "http://127.0.0.1:8001", GivenURL: "http://127.0.0.1:8001/", Role: shared.RoleAggregated, Models: []string{"llama", "qwen"},
		TotalKVBlocks: 4096, MetricsURL: "http://127.0.0.1:8001/metrics"},
	{Name: "b", URL: "http://127.0.0.1:8002/v1base", Role: shared.RoleDecode, Models: []string{"llama"},
		TotalKVBlocks: 10, MetricsURL: "http://127.0.0.1:9002/m", Labels: map[string]string{"zone": "eu-1", "example.com/gpu": "h100", "empty": ""}},
}

var ignoreRanges = cmpopts.IgnoreFields(Worker{}, "Range", "AttrRanges")

func TestWorkerBlocksInPolicyFile(t *testing.T) {
	b, diags := Load("p.hcl", []byte(workersSrc), testCatalog(t))
	if diags.HasErrors() || len(diags) > 0 {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if diff := cmp.Diff(wantWorkers, b.Workers, ignoreRanges); diff != "" {
		t.Fatalf("workers (-want +got):\n%s", diff)
	}
	if got := pos(b.Workers[1].Range); got != "p.hcl:6:1" {
		t.Errorf("b range = %s, want p.hcl:6:1", got)
	}
	if got := pos(b.Workers[1].AttrRanges["metrics_url"]); got != "p.hcl:11:3" {
		t.Errorf("b metrics_url range = %s, want p.hcl:11:3", got)
	}
	if !b.Workers[0].Equal(wantWorkers[0]) || b.Workers[0].Equal(wantWorkers[1]) {
		t.Error("Equal")
	}
	relabelled := b.Workers[1]
	relabelled.Labels = map[string]string{"zone": "eu-2"}
	if relabelled.Equal(b.Workers[1]) {
		t.Error("Equal ignores labels")
	}
	b, _ = Load("p.hcl", nil, testCatalog(t))
	if b.Workers != nil {
		t.Errorf("no worker blocks: Workers = %v", b.Workers)
	}
}

// workerDiagCases pin each worker-block error at file:line:col.
var workerDiagCases = []struct{ name, src, want string }{
	{"labels not a map", `worker "a" {
  url    = "http://h:1"
  labels = ["zone"]
}`, "w.hcl:3:12: error: Incorrect attribute value type"},
	{"label under the router's prefix", `worker "a" {
  url    = "http://h:1"
  labels = { "switchyard.io/role" = "decode" }
}`, `w.hcl:3:12: error: Invalid labels; Label key "switchyard.io/role" is under "switchyard.io/", which the router sets itself`},
	{"label under the router's prefix in another case", `worker "a" {
  url    = "http://h:1"
  labels = { "Switchyard.IO/zone" = "eu" }
}`, `w.hcl:3:12: error: Invalid labels; Label key "Switchyard.IO/zone" is under "switchyard.io/", which the router sets itself`},
	{"label set twice", `worker "a" {
  url    = "http://h:1"
  labels = { zone = "us", zone = "eu" }
}`, `w.hcl:3:27: error: Duplicate label; "zone" is set twice in labels, first at w.hcl:3:14; keep one of them.`},
	{"label value not a string", `worker "a" {
  url    = "http://h:1"
  labels = { zone = ["eu"] }
}`, "w.hcl:3:12: error: Incorrect attribute value type"},
	{"label null", `worker "a" {
  url    = "http://h:1"
  labels = { zone = null }
}`, `w.hcl:3:12: error: Invalid labels; Label "zone" is null`},
	{"label with a control character", `worker "a" {
  url    = "http://h:1"
  labels = { zone = "eu\n1" }
}`, `w.hcl:3:12: error: Invalid labels; Label "zone": the value must be UTF-8 without control characters`},
	{"empty label key", `worker "a" {
  url    = "http://h:1"
  labels = { "" = "x" }
}`, `w.hcl:3:12: error: Invalid labels; Label key "" must be 1 to 317 bytes`},
	{"bad url", `worker "a" {
  url             = "127.0.0.1:8001"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:2:21: error: Invalid URL"},
	{"no host", `worker "a" {
  url             = "http:///x"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:2:21: error: Invalid URL"},
	{"query", `worker "a" {
  url             = "http://h:1/?x=1"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:2:21: error: Invalid URL"},
	{"bad metrics url", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1
  metrics_url     = "ftp://h/metrics"
}`, "w.hcl:5:21: error: Invalid URL"},
	{"unknown role", `worker "a" {
  url             = "http://h:1"
  role            = "both"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:3:21: error: Invalid role"},
	{"duplicate", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1
}
worker "a" {
  url             = "http://h:2"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:6:8: error: Duplicate worker; Worker \"a\" is already declared at w.hcl:1:1"},
	{"reserved", `worker "default" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:1:8: error: Reserved name"},
	{"invalid name", `worker "a b" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:1:8: error: Invalid name"},
	{"zero blocks", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 0
}`, "w.hcl:4:21: error: Invalid total_kv_blocks"},
	{"negative blocks", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = -5
}`, "w.hcl:4:21: error: Invalid total_kv_blocks"},
	{"fractional blocks", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1.5
}`, "w.hcl:4:21: error: Invalid integer"},
	{"no models", `worker "a" {
  url             = "http://h:1"
  models          = []
  total_kv_blocks = 1
}`, "w.hcl:3:21: error: Invalid models"},
	{"duplicate model", `worker "a" {
  url             = "http://h:1"
  models          = ["m", "m"]
  total_kv_blocks = 1
}`, "w.hcl:3:21: error: Invalid models; Model \"m\" is listed twice."},
	{"empty model", `worker "a" {
  url             = "http://h:1"
  models          = [""]
  total_kv_blocks = 1
}`, "w.hcl:3:21: error: Invalid models"},
	{"missing url", `worker "a" {
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:1:12: error: Missing required argument"},
	{"kv_events without endpoint", `worker "a" {
  url = "http://h:1"
  kv_events {
    topic = "kv"
  }
}`, "w.hcl:3:13: error: Missing required argument"},
	{"kv_events not tcp", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "ipc:///tmp/kv"
  }
}`, "w.hcl:4:16: error: Invalid endpoint"},
	{"kv_events no port", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "tcp://h"
  }
}`, "w.hcl:4:16: error: Invalid endpoint"},
	{"kv_events bad port", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "tcp://h:70000"
  }
}`, "w.hcl:4:16: error: Invalid endpoint; The port of \"endpoint\" must be a number from 1 to 65535, got \"70000\"."},
	{"kv_events wildcard host", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "tcp://*:5557"
  }
}`, "w.hcl:4:16: error: Invalid endpoint; The value of \"endpoint\" must name the engine's host"},
	{"kv_events bad replay", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint        = "tcp://h:5557"
    replay_endpoint = "tcp://h:5558/x"
  }
}`, "w.hcl:5:23: error: Invalid endpoint"},
	{"kv_events bad snapshot", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint          = "tcp://h:5557"
    snapshot_endpoint = "ipc:///tmp/s"
  }
}`, "w.hcl:5:25: error: Invalid endpoint"},
	{"kv_events twice", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "tcp://h:5557"
  }
  kv_events {
    endpoint = "tcp://h:5558"
  }
}`, "w.hcl:6:3: error: Duplicate kv_events block; Worker \"a\" already has a kv_events block at w.hcl:3:3"},
	{"kv_events unknown attribute", `worker "a" {
  url = "http://h:1"
  kv_events {
    endpoint = "tcp://h:5557"
    medium   = "GPU"
  }
}`, "w.hcl:5:5: error: Unsupported argument"},
	{"unknown attribute", `worker "a" {
  url             = "http://h:1"
  models          = ["m"]
  total_kv_blocks = 1
  weight          = 2
}`, "w.hcl:5:3: error: Unsupported argument"},
	{"null role", `worker "a" {
  url             = "http://h:1"
  role            = null
  models          = ["m"]
  total_kv_blocks = 1
}`, "w.hcl:3:21: error: Invalid attribute value"},
}

func TestWorkerBlockDiagnostics(t *testing.T) {
	cat := testCatalog(t)
	for _, tt := range workerDiagCases {
		t.Run(tt.name, func(t *testing.T) {
			b, diags := Load("w.hcl", []byte(tt.src), cat)
			if got := FormatDiagnostics(diags); !strings.HasPrefix(got, tt.want) || b != nil {
				t.Errorf("policy file: bundle %v, diagnostics\n%s\nwant prefix %q", b != nil, got, tt.want)
			}
			ws, diags := ParseWorkers("w.hcl", []byte(tt.src))
			if got := FormatDiagnostics(diags); !strings.HasPrefix(got, tt.want) || ws != nil {
				t.Errorf("workers file: workers %v, diagnostics\n%s\nwant prefix %q", ws, got, tt.want)
			}
		})
	}
}

// TestURLOnlyWorker: a worker block needs only a url; models and
// total_kv_blocks are left to the engine, and a kv_events block is parsed.
func TestURLOnlyWorker(t *testing.T) {
	src := `worker "a" {
  url = "http://10.0.0.5:8000"
}
worker "b" {
  url = "http://10.0.0.6:8000"
  kv_events {
    endpoint        = "tcp://10.0.0.6:5557"
    topic           = "kv@"
    replay_endpoint = "tcp://10.0.0.6:5558"
    snapshot_endpoint = "tcp://10.0.0.6:5559"
  }
}
worker "c" {
  url = "http://10.0.0.7:8000"
  kv_events {
    endpoint        = "tcp://[::1]:5557"
    replay_endpoint = ""
  }
}
`
	ws, diags := ParseWorkers("w.hcl", []byte(src))
	if len(diags) > 0 {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	want := []Worker{
		{Name: "a", URL: "http://10.0.0.5:8000", Role: shared.RoleAggregated, MetricsURL: "http://10.0.0.5:8000/metrics"},
		{Name: "b", URL: "http://10.0.0.6:8000", Role: shared.RoleAggregated, MetricsURL: "http://10.0.0.6:8000/metrics",
			KVEvents: &KVEvents{Endpoint: "tcp://10.0.0.6:5557", Topic: "kv@", ReplayEndpoint: "tcp://10.0.0.6:5558", SnapshotEndpoint: "tcp://10.0.0.6:5559"}},
		{Name: "c", URL: "http://10.0.0.7:8000", Role: shared.RoleAggregated, MetricsURL: "http://10.0.0.7:8000/metrics",
			KVEvents: &KVEvents{Endpoint: "tcp://[::1]:5557"}},
	}
	if diff := cmp.Diff(want, ws, ignoreRanges, cmpopts.IgnoreFields(KVEvents{}, "Range")); diff != "" {
		t.Fatalf("workers (-want +got):\n%s", diff)
	}
	if got := pos(ws[1].KVEvents.Range); got != "w.hcl:6:3" {
		t.Errorf("kv_events range = %s, want w.hcl:6:3", got)
	}
	if ws[1].Equal(ws[2]) || !ws[1].Equal(ws[1]) {
		t.Error("Equal of distinct workers")
	}
	other := ws[1]
	other.KVEvents = &KVEvents{Endpoint: "tcp://10.0.0.6:5557", Topic: "kv@", SnapshotEndpoint: "tcp://10.0.0.6:5559"}
	if ws[1].Equal(other) {
		t.Error("Equal ignores kv_events.replay_endpoint")
	}
	other.KVEvents = &KVEvents{Endpoint: "tcp://10.0.0.6:5557", Topic: "kv@", ReplayEndpoint: "tcp://10.0.0.6:5558"}
	if ws[1].Equal(other) {
		t.Error("Equal ignores kv_events.snapshot_endpoint")
	}
	other.KVEvents = nil
	if ws[1].Equal(other) || other.Equal(ws[1]) {
		t.Error("Equal ignores a missing kv_events block")
	}
}

func TestLoadWorkers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "workers.hcl")
	if err := os.WriteFile(path, []byte(workersSrc), 0o600); err != nil {
		t.Fatal(err)
	}
	ws, diags := LoadWorkers(path)
	if len(diags) > 0 {
		t.Fatalf("diagnostics:\n%s", FormatDiagnostics(diags))
	}
	if diff := cmp.Diff(wantWorkers, ws, ignoreRanges); diff != "" {
		t.Fatalf("workers (-want +got):\n%s", diff)
	}

	// JSON syntax.
	jsonPath := filepath.Join(dir, "workers.json")
	js := `{"worker": {"a": {"url": "http://127.0.0.1:8001", "models": ["llama", "qwen"], "total_kv_blocks": 4096}}}`
	if err := os.WriteFile(jsonPath, []byte(js), 0o600); err != nil {
		t.Fatal(err)
	}
	ws, diags = LoadWorkers(jsonPath)
	if len(diags) > 0 || len(ws) != 1 || !ws[0].Equal(wantWorkers[0]) {
		t.Fatalf("json: %+v\n%s", ws, FormatDiagnostics(diags))
	}

	// An empty file has no workers, and is not an error.
	ws, diags = ParseWorkers("empty.hcl", nil)
	if ws == nil || len(ws) != 0 || len(diags) > 0 {
		t.Errorf("empty file: %v %s", ws, FormatDiagnostics(diags))
	}

	for _, tt := range []struct{ src, want string }{
		{"policy \"p\" {\n}\n", "w.hcl:1:1: error: Unsupported block type"},
		{workersSrc + "router {\n  block_size = 16\n}\n", "w.hcl:14:1: error: Unsupported block type"},
		{"block_size = 16\n", "w.hcl:1:1: error: Unsupported argument"},
		{"worker \"a\" {\n", "w.hcl:1:12: error: Unclosed configuration block"},
	} {
		ws, diags := ParseWorkers("w.hcl", []byte(tt.src))
		if got := FormatDiagnostics(diags); !strings.HasPrefix(got, tt.want) || ws != nil {
			t.Errorf("%q: workers %v, diagnostics\n%s\nwant prefix %q", tt.src, ws, got, tt.want)
		}
	}

	_, diags = LoadWorkers(filepath.Join(dir, "missing.hcl"))
	if got := FormatDiagnostics(diags); !strings.Contains(got, "missing.hcl:1:1: error: Failed to read workers file") {
		t.Errorf("missing file: %s", got)
	}
	if diags[0].Subject == nil || diags[0].Subject.Start != hcl.InitialPos {
		t.Errorf("missing file subject = %v", diags[0].Subject)
	}
}

// FuzzParseWorkers: a workers file never panics the loader, every error has
// a position, and workers come back exactly when there is no error.
//
//	go test -fuzz=FuzzParseWorkers -fuzztime=30s ./router/config/
func FuzzParseWorkers(f *testing.F) {
	f.Add([]byte(workersSrc))
	for _, c := range workerDiagCases {
		f.Add([]byte(c.src))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		ws, diags := ParseWorkers("fuzz.hcl", src)
		if diags.HasErrors() != (ws == nil) {
			t.Fatalf("workers %v with diagnostics\n%s", ws, FormatDiagnostics(diags))
		}
		for _, d := range diags {
			if d.Severity == hcl.DiagError && d.Subject == nil {
				t.Fatalf("error without a position: %s", FormatDiagnostics(hcl.Diagnostics{d}))
			}
		}
		for _, w := range ws {
			if w.URL == "" || w.MetricsURL == "" || !w.Role.Valid() || (w.Models != nil && len(w.Models) == 0) || w.TotalKVBlocks < 0 ||
				(w.KVEvents != nil && w.KVEvents.Endpoint == "") {
				t.Fatalf("invalid worker loaded: %+v", w)
			}
		}
	})
}

func TestWorkerURLPortAndSecrets(t *testing.T) {
	for _, tt := range []struct{ url, want, notWant string }{
		{"http://127.0.0.1:99999", `The port of "url" must be a number from 1 to 65535, got "99999"`, ""},
		{"http://127.0.0.1:0", `got "0"`, ""},
		{"http://user:s3cret@127.0.0.1:8001/", "must have no user", "s3cret"},
		// Without a scheme: "127.0.0.1:8001" fails url.Parse ("first path
		// segment in URL cannot contain colon"), "localhost:8001" parses
		// with scheme "localhost"; both say what to write.
		{"127.0.0.1:8001", `The value of "url" has no scheme: want http://HOST:PORT (add "http://": "http://127.0.0.1:8001").` + "\n", "cannot contain colon"},
		{"localhost:8001", `The value of "url" has no scheme: want http://HOST:PORT (add "http://": "http://localhost:8001").` + "\n", `got scheme "localhost"`},
		{"user:s3cret@10.0.0.5:8000", `has no scheme: want http://HOST:PORT (add "http://": "http://10.0.0.5:8000").` + "\n", "s3cret"},
	} {
		src := "worker \"w\" {\n  url             = \"" + tt.url + "\"\n  models          = [\"m\"]\n  total_kv_blocks = 10\n}\n"
		_, diags := Load("w.hcl", []byte(src), nil)
		got := FormatDiagnostics(diags)
		if !strings.Contains(got, "w.hcl:2:21: error: Invalid URL") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: %s", tt.url, got)
		}
		if tt.notWant != "" && strings.Contains(got, tt.notWant) {
			t.Errorf("%s: the diagnostic echoes the password: %s", tt.url, got)
		}
	}
}

// TestWorkerURLNormalised: a url ending in "/", "/v1" or "/v1/" (OpenAI
// clients' base URL) loads as the engine's base URL, the form written kept
// in GivenURL; a path prefix in front of the engine is kept as it is.
// Before, "http://h:8000/v1" loaded as is, and every request went to
// /v1/v1/chat/completions (404 model_not_found).
func TestWorkerURLNormalised(t *testing.T) {
	for _, tt := range []struct{ given, url, given2 string }{
		{"http://10.0.0.5:8000", "http://10.0.0.5:8000", ""},
		{"http://10.0.0.5:8000/", "http://10.0.0.5:8000", "http://10.0.0.5:8000/"},
		{"http://10.0.0.5:8000/v1", "http://10.0.0.5:8000", "http://10.0.0.5:8000/v1"},
		{"http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000", "http://10.0.0.5:8000/v1/"},
		{"https://gw.example/V1", "https://gw.example", "https://gw.example/V1"},
		{"http://[::1]:8000/v1", "http://[::1]:8000", "http://[::1]:8000/v1"},
		// A reverse proxy's prefix is kept, with or without /v1 after it.
		{"http://gw:80/engines/a", "http://gw:80/engines/a", ""},
		{"http://gw:80/engines/a/v1/", "http://gw:80/engines/a", "http://gw:80/engines/a/v1/"},
		{"http://127.0.0.1:8002/v1base", "http://127.0.0.1:8002/v1base", ""},
	} {
		src := "worker \"w\" {\n  url = \"" + tt.given + "\"\n}\n"
		ws, diags := ParseWorkers("w.hcl", []byte(src))
		if len(diags) > 0 || len(ws) != 1 {
			t.Errorf("%s: %s", tt.given, FormatDiagnostics(diags))
			continue
		}
		if w := ws[0]; w.URL != tt.url || w.GivenURL != tt.given2 || w.MetricsURL != tt.url+"/metrics" {
			t.Errorf("%s: URL %q GivenURL %q MetricsURL %q, want %q %q %q", tt.given, w.URL, w.GivenURL, w.MetricsURL, tt.url, tt.given2, tt.url+"/metrics")
		}
	}
	a, _ := ParseWorkers("a.hcl", []byte("worker \"w\" {\n  url = \"http://h:1/v1\"\n}\n"))
	b, _ := ParseWorkers("b.hcl", []byte("worker \"w\" {\n  url = \"http://h:1\"\n}\n"))
	if !a[0].Equal(b[0]) {
		t.Error("two spellings of one base URL are not Equal: the worker would restart on the edit")
	}
}

// TestWorkerURLRefused: a url naming an endpoint, or with a path that is
// not clean, is refused at its file:line:col, saying why.
func TestWorkerURLRefused(t *testing.T) {
	for _, tt := range []struct{ url, want string }{
		{"http://h:8000/v1/chat/completions", `names an endpoint (path "/v1/chat/completions"), not the engine's base URL: the router appends /v1/chat/completions`},
		{"http://h:8000/v1/models", `names an endpoint (path "/v1/models")`},
		{"http://h:8000/v1/v1", `names an endpoint (path "/v1/v1")`},
		{"http://h:8000/metrics", `names an endpoint (path "/metrics")`},
		{"http://h:8000/prefix/health", `names an endpoint (path "/prefix/health")`},
		{"http://h:8000/kv_event_sources", `names an endpoint`},
		{"http://h:8000/a//b", `is not clean`},
		{"http://h:8000/a/../b", `is not clean`},
		{"http://h:8000//v1", `is not clean`},
	} {
		src := "worker \"w\" {\n  url = \"" + tt.url + "\"\n}\n"
		ws, diags := ParseWorkers("w.hcl", []byte(src))
		got := FormatDiagnostics(diags)
		if ws != nil || !strings.HasPrefix(got, "w.hcl:2:9: error: Invalid URL; The value of \"url\" is refused: ") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: workers %v, diagnostics\n%s\nwant %q", tt.url, ws, got, tt.want)
		}
	}
}

func TestEngineBaseURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"http://h", "http://h"},
		{"http://h/", "http://h"},
		{"http://h/v1", "http://h"},
		{"http://h/p%20q/v1", "http://h/p%20q"},
		{"http://h/api/v1/", "http://h/api"},
	} {
		if got, err := EngineBaseURL(tt.in); err != nil || got != tt.want {
			t.Errorf("EngineBaseURL(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := EngineBaseURL("http://h/%76%31"); err == nil {
		t.Error(`an escaped "v1" segment taken as a base URL`)
	}
}

// TestWorkersAtOneURLAcross: a workers file's workers at the url of a
// policy file's worker (as written, or normalised alike) are warned
// about at the workers file's blocks, naming the policy file's block and
// where it is; a url of the workers file alone is not.
func TestWorkersAtOneURLAcross(t *testing.T) {
	policy, diags := Load("p.hcl", []byte("worker \"a\" {\n  url = \"http://127.0.0.1:8001\"\n}\n"+
		"worker \"b\" {\n  url = \"http://127.0.0.1:8002\"\n}\n"), catalog.Default())
	if policy == nil || len(diags) != 0 {
		t.Fatalf("policy file: %s", FormatDiagnostics(diags))
	}
	file, diags := ParseWorkers("w.hcl", []byte("worker \"x\" {\n  url = \"http://127.0.0.1:8001/v1\"\n}\n"+
		"worker \"y\" {\n  url = \"http://127.0.0.1:8003\"\n}\n"+
		"worker \"z\" {\n  url = \"http://127.0.0.1:8002\"\n}\n"))
	if len(file) != 3 || len(diags) != 0 {
		t.Fatalf("workers file: %d workers, %s", len(file), FormatDiagnostics(diags))
	}
	warn := func(name, line, first, firstAt, url string) string {
		return fmt.Sprintf("w.hcl:%s:1: warning: Two workers at one URL; Worker %q (here) and worker %q (p.hcl:%s:1) both have url %q: "+
			"one engine counted as two workers, with two capacities and two bookings. Remove one, or give each its engine's URL.\n", line, name, first, firstAt, url)
	}
	want := warn("x", "1", "a", "1", "http://127.0.0.1:8001") + warn("z", "7", "b", "4", "http://127.0.0.1:8002")
	if got := FormatDiagnostics(SameURLAcross(policy.Workers, file)); got != want {
		t.Errorf("SameURLAcross:\n%s\nwant\n%s", got, want)
	}
	if got := SameURLAcross(file[1:2], policy.Workers); len(got) != 0 {
		t.Errorf("distinct urls: %s", FormatDiagnostics(got))
	}
}

// TestWorkersAtOneURL: two worker blocks of different names with one url
// (as written, or normalised alike: a trailing "/v1") load, both, with a
// warning at the second naming both blocks and where the first is; a third
// at that url is warned about too, and distinct urls are not. The same
// holds in a workers file (ParseWorkers).
func TestWorkersAtOneURL(t *testing.T) {
	src := "worker \"a\" {\n  url = \"http://127.0.0.1:8001\"\n}\n" +
		"worker \"b\" {\n  url = \"http://127.0.0.1:8001/v1\"\n}\n" +
		"worker \"c\" {\n  url = \"http://127.0.0.1:8002\"\n}\n" +
		"worker \"d\" {\n  url = \"http://127.0.0.1:8001\"\n}\n"
	warn := func(name string, line int) string {
		return fmt.Sprintf("w.hcl:%d:1: warning: Two workers at one URL; Worker %q (here) and worker \"a\" (w.hcl:1:1) both have url \"http://127.0.0.1:8001\": "+
			"one engine counted as two workers, with two capacities and two bookings. Remove one, or give each its engine's URL.\n", line, name)
	}
	want := warn("b", 4) + warn("d", 10)
	b, diags := Load("w.hcl", []byte(src), catalog.Default())
	if b == nil || len(b.Workers) != 4 || FormatDiagnostics(diags) != want {
		t.Errorf("policy file: %d workers, diagnostics\n%s\nwant 4 and\n%s", len(b.Workers), FormatDiagnostics(diags), want)
	}
	ws, diags := ParseWorkers("w.hcl", []byte(src))
	if len(ws) != 4 || FormatDiagnostics(diags) != want {
		t.Errorf("workers file: %d workers, diagnostics\n%s\nwant 4 and\n%s", len(ws), FormatDiagnostics(diags), want)
	}
}
