package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The engines' own answers, as their routes and tests give them.
const (
	// vllmSourcesEnvelope is vLLM's GET /kv_event_sources answer in the
	// {"sources": [...]} revision: vllm-project/vllm@f123199a
	// vllm/entrypoints/serve/kv_events/api_router.py, body as asserted by
	// tests/entrypoints/serve/test_kv_events_router.py@5f920ec3
	// test_returns_sources_json (ranks in the engine client's order, a
	// wildcard IP, replay None for rank 1).
	vllmSourcesEnvelope = `{"sources": [
  {"data_parallel_rank": 1, "endpoint": "tcp://0.0.0.0:41002", "replay_endpoint": null, "topic": "kv-events"},
  {"data_parallel_rank": 0, "endpoint": "tcp://0.0.0.0:41001", "replay_endpoint": "tcp://0.0.0.0:41003", "topic": "kv-events"}
]}`
	// vllmSourcesArray is the bare-array revision: vllm-project/vllm@153c3aa2
	// api_router.py (JSONResponse(sources)), body as asserted by
	// tests/entrypoints/serve/kv_events/test_api_router.py@c2090fe4.
	vllmSourcesArray = `[{"data_parallel_rank": 0, "endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": null, "topic": ""}]`
	// vllmSourcesSnapshot is a source serialised from the snapshot
	// branch's KVEventsConfig (vMaroon/vllm@08ee3e54: snapshot_endpoint,
	// and the config's other fields, which are ignored), with the
	// configured wildcard kept as vLLM reports it (test_events.py
	// test_event_publisher_factory: "tcp://*:PORT").
	vllmSourcesSnapshot = `{"sources": [{"data_parallel_rank": 0, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
  "snapshot_endpoint": "tcp://*:5559", "topic": "", "publisher": "zmq", "buffer_steps": 10000, "hwm": 100000,
  "max_queue_size": 100000, "enable_kv_cache_events": true}]}`
	// sglangInfoBody is the part of SGLang's GET /server_info the router
	// reads, around the kv_events descriptor that
	// describe_kv_events_publisher returns (SGLang PR 25844; its docstring
	// gives the shape, its tests the values: endpoint_host "*", port base
	// 5557, topic "", block_size 16, dp_size 2), among server arguments.
	sglangInfoBody = `{"model_path": "Qwen/Qwen3-8B", "page_size": 16, "dp_size": 2, "tp_size": 2,
  "kv_events_config": "{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"topic\": \"\"}",
  "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "",
    "block_size": 16, "dp_size": 2},
  "internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.16"}`
	// sglangServerInfoNoEvents is /server_info of SGLang without
	// --kv-events-config: kv_events null, page_size still reported.
	sglangServerInfoNoEvents = `{"model_path": "Qwen/Qwen3-8B", "page_size": 64, "kv_events": null, "version": "0.5.16"}`
)

func TestParseVLLMSources(t *testing.T) {
	for _, tt := range []struct {
		name, body, host string
		want             []KVSource
	}{
		{"envelope, wildcard IP resolved, sorted by rank", vllmSourcesEnvelope, "10.0.0.5", []KVSource{
			{Rank: 0, Endpoint: "tcp://10.0.0.5:41001", ReplayEndpoint: "tcp://10.0.0.5:41003", Topic: "kv-events"},
			{Rank: 1, Endpoint: "tcp://10.0.0.5:41002", Topic: "kv-events"},
		}},
		{"bare array, concrete IP kept", vllmSourcesArray, "vllm.example", []KVSource{{Rank: 0, Endpoint: "tcp://10.0.0.1:5557"}}},
		{"snapshot endpoint, unknown fields ignored, * resolved", vllmSourcesSnapshot, "vllm-0.svc", []KVSource{
			{Rank: 0, Endpoint: "tcp://vllm-0.svc:5557", ReplayEndpoint: "tcp://vllm-0.svc:5558", SnapshotEndpoint: "tcp://vllm-0.svc:5559"},
		}},
		{"empty (no publisher)", `{"sources": []}`, "h", nil},
		{"loopback is the engine's own host", `[{"data_parallel_rank": 0, "endpoint": "tcp://127.0.0.1:5557"}, {"data_parallel_rank": 1, "endpoint": "tcp://[::1]:5558"}, {"data_parallel_rank": 2, "endpoint": "tcp://localhost:5559"}]`,
			"fd00::5", []KVSource{{Rank: 0, Endpoint: "tcp://[fd00::5]:5557"}, {Rank: 1, Endpoint: "tcp://[fd00::5]:5558"}, {Rank: 2, Endpoint: "tcp://[fd00::5]:5559"}}},
		{"[::] resolved", `[{"data_parallel_rank": 0, "endpoint": "tcp://[::]:5557"}]`, "10.0.0.9", []KVSource{{Rank: 0, Endpoint: "tcp://10.0.0.9:5557"}}},
		{"ipc and port 0 left out", `[{"data_parallel_rank": 0, "endpoint": "ipc:///tmp/kv"}, {"data_parallel_rank": 1, "endpoint": "tcp://*:0"}, {"data_parallel_rank": 2, "endpoint": "tcp://*:5559", "replay_endpoint": "ipc:///tmp/r"}]`,
			"h", []KVSource{{Rank: 2, Endpoint: "tcp://h:5559"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := parseVLLMSources([]byte(tt.body), tt.host)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, d.sources); diff != "" {
				t.Errorf("sources (-want +got):\n%s", diff)
			}
		})
	}
	d, _ := parseVLLMSources([]byte(`[{"data_parallel_rank": 0, "endpoint": "ipc:///tmp/kv"}]`), "h")
	if !strings.Contains(d.skipped, `rank 0: endpoint "ipc:///tmp/kv" is not tcp://`) {
		t.Errorf("skipped = %q", d.skipped)
	}

	var many strings.Builder
	many.WriteString("[")
	for i := range MaxRanks + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `{"data_parallel_rank": %d, "endpoint": "tcp://h:1"}`, i)
	}
	many.WriteString("]")
	for _, tt := range []struct{ name, body, want string }{
		{"not json", "<html>", "not {\"sources\": [...]} nor a list"},
		{"object without sources", `{"data": []}`, `an object without "sources"`},
		{"too many", many.String(), "1025 sources, more than 1024"},
		{"rank twice", `[{"data_parallel_rank": 0, "endpoint": "tcp://h:1"}, {"data_parallel_rank": 0, "endpoint": "tcp://h:2"}]`, "data_parallel_rank 0 listed twice"},
		{"negative rank", `[{"data_parallel_rank": -1, "endpoint": "tcp://h:1"}]`, "data_parallel_rank -1 is not in 0..1023"},
		{"not an endpoint", `[{"data_parallel_rank": 0, "endpoint": "h:5557"}]`, `rank 0: endpoint: "h:5557" is not "tcp://HOST:PORT"`},
		{"bad port", `[{"data_parallel_rank": 0, "endpoint": "tcp://h:70000"}]`, "the port is not a number from 1 to 65535"},
		{"long endpoint", `[{"data_parallel_rank": 0, "endpoint": "tcp://` + strings.Repeat("h", MaxEndpointBytes) + `:1"}]`, "bytes, more than 512"},
		{"long topic", `[{"data_parallel_rank": 0, "endpoint": "tcp://h:1", "topic": "` + strings.Repeat("t", MaxEndpointBytes+1) + `"}]`, "topic of 513 bytes"},
		{"control bytes escaped", `[{"data_parallel_rank": 0, "endpoint": "\u001b[31mtcp"}]`, `\x1b[31mtcp`},
		{"control bytes in the host", `[{"data_parallel_rank": 0, "endpoint": "tcp://a\u0007b:1"}]`, `x07b:1" names no host the router can dial`},
		{"a path", `[{"data_parallel_rank": 0, "endpoint": "tcp://h/x:1"}]`, `names no host the router can dial`},
	} {
		_, err := parseVLLMSources([]byte(tt.body), "h")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestParseSGLangServerInfo(t *testing.T) {
	d, err := parseSGLangServerInfo([]byte(sglangInfoBody), "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	want := discovery{blockSize: 16, sources: []KVSource{{Rank: 0, Endpoint: "tcp://10.1.2.3:5557"}, {Rank: 1, Endpoint: "tcp://10.1.2.3:5558"}}}
	if diff := cmp.Diff(want, d, cmp.AllowUnexported(discovery{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if d, err := parseSGLangServerInfo([]byte(sglangServerInfoNoEvents), "h"); err != nil || d.sources != nil || d.blockSize != 64 {
		t.Errorf("no events: %+v, %v; want no sources, block size 64 (page_size)", d, err)
	}
	// vLLM's /server_info (VLLM_SERVER_DEV_MODE only) says neither.
	if d, err := parseSGLangServerInfo([]byte(`{"vllm_config": "ModelConfig(...)"}`), "h"); err != nil || d.sources != nil || d.blockSize != 0 {
		t.Errorf("vLLM dev-mode server_info: %+v, %v", d, err)
	}
	// A concrete host is kept; an IPv6 one bracketed; no dp_size is one rank.
	d, err = parseSGLangServerInfo([]byte(`{"kv_events": {"publisher": "zmq", "endpoint_host": "fd00::7", "endpoint_port_base": 6000, "topic": "kv", "block_size": 32}}`), "h")
	if want := []KVSource{{Rank: 0, Endpoint: "tcp://[fd00::7]:6000", Topic: "kv"}}; err != nil || !cmp.Equal(want, d.sources) || d.blockSize != 32 {
		t.Errorf("IPv6 host: %+v, %v", d, err)
	}
	for _, tt := range []struct{ name, body, want string }{
		{"not json", "<html>", "not a server_info object"},
		{"port past 65535", `{"kv_events": {"endpoint_host": "*", "endpoint_port_base": 65535, "dp_size": 2}}`, "endpoint_port_base 65535 + dp_size 2 passes port 65535"},
		{"no port", `{"kv_events": {"endpoint_host": "*"}}`, "endpoint_port_base"},
		{"dp_size too large", `{"kv_events": {"endpoint_host": "*", "endpoint_port_base": 5557, "dp_size": 5000}}`, "dp_size \"5000\" is not a number from 1 to 1024"},
		{"bad host", `{"kv_events": {"endpoint_host": "a/b", "endpoint_port_base": 5557}}`, "is not a host"},
	} {
		if _, err := parseSGLangServerInfo([]byte(tt.body), "h"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}

// discoveryEngine is an httptest engine answering the discovery routes:
// each path's body and status; a path it does not list answers 404.
type discoveryEngine struct {
	srv   *httptest.Server
	mu    sync.Mutex
	paths map[string]route
	hits  map[string]int
}

type route struct {
	code int
	body string
}

func newDiscoveryEngine(t *testing.T, paths map[string]route) *discoveryEngine {
	t.Helper()
	e := &discoveryEngine{paths: paths, hits: map[string]int{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		rt, ok := e.paths[r.URL.Path]
		e.hits[r.URL.Path]++
		e.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		if rt.code != 0 && rt.code != http.StatusOK {
			http.Error(w, "no", rt.code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, rt.body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *discoveryEngine) set(path string, rt route) {
	e.mu.Lock()
	e.paths[path] = rt
	e.mu.Unlock()
}

func (e *discoveryEngine) hitsOf(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

// TestDiscover: the engines' discovery routes over HTTP, in the order a
// worker is asked: vLLM's, then SGLang's two; 404 everywhere is none.
func TestDiscover(t *testing.T) {
	for _, tt := range []struct {
		name  string
		paths map[string]route
		want  []KVSource
		from  string
		block int64
	}{
		{"vLLM envelope", map[string]route{"/kv_event_sources": {body: vllmSourcesEnvelope}, "/server_info": {body: sglangInfoBody}}, []KVSource{
			{Rank: 0, Endpoint: "tcp://127.0.0.1:41001", ReplayEndpoint: "tcp://127.0.0.1:41003", Topic: "kv-events"},
			{Rank: 1, Endpoint: "tcp://127.0.0.1:41002", Topic: "kv-events"},
		}, "/kv_event_sources", 0},
		{"vLLM bare array", map[string]route{"/kv_event_sources": {body: vllmSourcesArray}}, []KVSource{{Rank: 0, Endpoint: "tcp://10.0.0.1:5557"}}, "/kv_event_sources", 0},
		{"SGLang server_info", map[string]route{"/server_info": {body: sglangInfoBody}}, []KVSource{
			{Rank: 0, Endpoint: "tcp://127.0.0.1:5557"}, {Rank: 1, Endpoint: "tcp://127.0.0.1:5558"},
		}, "/server_info", 16},
		{"older SGLang: get_server_info", map[string]route{"/get_server_info": {body: sglangServerInfoNoEvents}}, nil, "/get_server_info", 64},
		{"older vLLM: 404 everywhere", map[string]route{}, nil, "", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newDiscoveryEngine(t, tt.paths)
			d, err := discover(context.Background(), http.DefaultClient, e.srv.URL, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			from := ""
			if d.from != "" {
				from = strings.TrimPrefix(d.from, e.srv.URL)
			}
			if diff := cmp.Diff(tt.want, d.sources); diff != "" || from != tt.from || d.blockSize != tt.block {
				t.Errorf("from %q block %d, want %q %d; sources (-want +got):\n%s", from, d.blockSize, tt.from, tt.block, diff)
			}
		})
	}
	for _, tt := range []struct {
		name  string
		paths map[string]route
		want  string
		is    error
	}{
		{"500", map[string]route{"/kv_event_sources": {code: 500}}, "HTTP status 500", nil},
		{"SGLang 503 after vLLM 404", map[string]route{"/server_info": {code: 503}}, "HTTP status 503", nil},
		{"malformed", map[string]route{"/kv_event_sources": {body: `{"sources": 3}`}}, "kv event sources unusable", ErrSources},
		{"too large", map[string]route{"/kv_event_sources": {body: `{"sources": [], "pad": "` + strings.Repeat("x", maxSourcesBytes) + `"}`}}, "is over 1024 KiB", ErrSources},
	} {
		e := newDiscoveryEngine(t, tt.paths)
		_, err := discover(context.Background(), http.DefaultClient, e.srv.URL, time.Minute)
		if err == nil || !strings.Contains(err.Error(), tt.want) || tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}
