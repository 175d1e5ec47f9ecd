package serve

import (
	"bufio"
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

// TestDaemonResponsesFollowUpsOnMockEngines: a daemon with a round-robin
// policy over three mock engines (vLLM's Responses API with its store):
// conversations of chained previous_response_id turns, streamed and not,
// each stay on the engine of their first turn (the mock answers 404 to
// an id it does not hold, so a turn sent elsewhere would fail), as does
// GET /v1/responses/{id}; an id nobody issued gets vLLM's 404 from the
// router; /v1/messages answers errors in Anthropic's shape, and
// /v1/embeddings passes through.
func TestDaemonResponsesFollowUpsOnMockEngines(t *testing.T) {
	var blocks strings.Builder
	for _, name := range []string{"a", "b", "c"} {
		m, err := mockworker.New(mockworker.Config{Model: "m", Speedup: 200})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		fmt.Fprintf(&blocks, "worker %q {\n  url = %q\n}\n", name, hs.URL)
	}
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	replaceFile(t, policy, "policy \"rr\" {\n  picker \"rr\" {\n    type = \"round-robin\"\n  }\n}\nworker_selection {\n  aggregated = \"rr\"\n}\n"+blocks.String())
	rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy})
	rd.waitWorkers(t, "a", "b", "c")

	turn := func(prev string, stream bool) (string, string) { return responsesTurn(t, rd, prev, stream) }
	for _, stream := range []bool{false, true, false} {
		prev, first := turn("", stream)
		for range 4 {
			id, w := turn(prev, stream)
			if w != first {
				t.Errorf("stream %v: the follow-up of %s went to %s, want %s", stream, prev, w, first)
			}
			prev = id
		}
		resp, err := http.Get(rd.base + "/v1/responses/" + prev)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Worker") != first || !strings.Contains(string(b), prev) {
			t.Errorf("GET %s = %d from %q: %s", prev, resp.StatusCode, resp.Header.Get("X-Switchyard-Worker"), b)
		}
	}
	resp, err := http.Post(rd.base+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"x","previous_response_id":"resp_0123"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"message":"Response with id 'resp_0123' not found."`) {
		t.Errorf("unknown previous_response_id: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Post(rd.base+"/v1/messages", "application/json", strings.NewReader(`{"model":"nope","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.HasPrefix(string(b), `{"type":"error","error":{"type":"invalid_request_error","message":`) {
		t.Errorf("/v1/messages for an unknown model: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Post(rd.base+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"m","input":["hello","world"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"embedding"`) {
		t.Errorf("/v1/embeddings: %d %s", resp.StatusCode, b)
	}
}

// responsesTurn sends a Responses request (continuing prev, when set;
// streamed or not) to rd and returns the answer's id and the worker that
// served it; an answer other than 200 fails the test.
func responsesTurn(t *testing.T, rd *runningDaemon, prev string, stream bool) (id, worker string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","input":"tell me more","max_output_tokens":4,"store":true,"stream":%v`, stream)
	if prev != "" {
		body += fmt.Sprintf(`,"previous_response_id":%q`, prev)
	}
	resp, err := http.Post(rd.base+"/v1/responses", "application/json", strings.NewReader(body+"}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("turn after %q (stream %v): %d %s\nlogs:\n%s", prev, stream, resp.StatusCode, b, rd.logs)
	}
	worker = resp.Header.Get("X-Switchyard-Worker")
	if !stream {
		var r struct{ ID string }
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r.ID, worker
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string
			Response struct{ ID string }
		}
		if json.Unmarshal([]byte(data), &ev) == nil && ev.Type == "response.created" && id == "" {
			id = ev.Response.ID
		}
	}
	if id == "" {
		t.Fatal("a stream without response.created")
	}
	return id, worker
}
