package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// TestDaemonModelsKeepEngineEntries: through a daemon over two mock
// engines (one with a LoRA adapter), GET /v1/models lists each model
// once, as its engine listed it (created, owned_by, root, parent,
// max_model_len unchanged), and GET /v1/models/{id} answers the same
// object; /tokenize reaches an engine, whose answer passes through.
func TestDaemonModelsKeepEngineEntries(t *testing.T) {
	var blocks strings.Builder
	var engineList []byte
	for i, name := range []string{"a", "b"} {
		cfg := mockworker.Config{Model: "org/base", Speedup: 50}
		if i == 0 {
			cfg.LoRA = []string{"sql-lora"}
		}
		m, err := mockworker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		fmt.Fprintf(&blocks, "worker %q {\n  url = %q\n}\n", name, hs.URL)
		if i == 0 {
			engineList = getBody(t, hs.URL+"/v1/models")
		}
	}
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, blocks.String())
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy})
	rd.waitWorkers(t, "a", "b")

	var engine, routed struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(engineList, &engine); err != nil || len(engine.Data) != 2 {
		t.Fatalf("engine a lists %s (%v)", engineList, err)
	}
	got := getBody(t, rd.base+"/v1/models")
	if err := json.Unmarshal(got, &routed); err != nil || routed.Object != "list" || len(routed.Data) != 2 {
		t.Fatalf("router lists %s (%v)", got, err)
	}
	for i := range engine.Data {
		if !jsonEqual(t, engine.Data[i], routed.Data[i]) {
			t.Errorf("entry %d: router %s, engine %s", i, routed.Data[i], engine.Data[i])
		}
	}
	if one := getBody(t, rd.base+"/v1/models/org%2Fbase"); !jsonEqual(t, one, engine.Data[0]) {
		t.Errorf("/v1/models/org%%2Fbase = %s, want %s", one, engine.Data[0])
	}
	if one := getBody(t, rd.base+"/v1/models/sql-lora"); !strings.Contains(string(one), `"parent":"org/base"`) {
		t.Errorf("the adapter's entry lost its parent: %s", one)
	}
	resp, err := http.Post(rd.base+"/tokenize", "application/json", strings.NewReader(`{"model":"org/base","prompt":"hello world"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// This mock has no tokenizer: its own 404 passes through unchanged.
	if resp.StatusCode != 404 || !strings.Contains(string(b), "this mock engine has no tokenizer") || resp.Header.Get("X-Switchyard-Worker") == "" {
		t.Errorf("/tokenize = %d %s", resp.StatusCode, b)
	}
}

func getBody(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s (%v)", url, resp.StatusCode, b, err)
	}
	return b
}

// jsonEqual reports whether a and b are the same model object, but for
// their permissions' ids, which vLLM (and the mock) make anew on every
// GET /v1/models; both must carry a permission list.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y map[string]any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	for _, m := range []map[string]any{x, y} {
		perms, ok := m["permission"].([]any)
		if !ok || len(perms) == 0 {
			return false
		}
		for _, p := range perms {
			delete(p.(map[string]any), "id")
		}
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}
