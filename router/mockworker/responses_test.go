package mockworker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/sim"
)

// namedEvent is one "event: TYPE\ndata: JSON" SSE event.
type namedEvent struct {
	typ  string
	data string
}

// namedEvents reads an SSE body of named events; a data line without an
// event line before it (a bare "data: [DONE]") has typ "".
func namedEvents(t *testing.T, r io.Reader) []namedEvent {
	t.Helper()
	var out []namedEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	typ := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			typ = ""
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			out = append(out, namedEvent{typ, strings.TrimPrefix(line, "data: ")})
		default:
			t.Fatalf("not an SSE line: %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// tokenizeMessages asks the server's /tokenize for the ids of msgs.
func tokenizeMessages(t *testing.T, url string, msgs []map[string]any) int {
	t.Helper()
	resp, body := post(t, url+"/tokenize", map[string]any{"model": testModel, "messages": msgs})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize: %d %s", resp.StatusCode, body)
	}
	var a tokenizeAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	return a.Count
}

type responseAnswer struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Status             string  `json:"status"`
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id"`
	IncompleteDetails  *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	MaxOutputTokens int `json:"max_output_tokens"`
	Output          []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

func tokenizerServer(t *testing.T, engine Engine) string {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.TotalKVBlocks = 1000
	_, url := startServer(t, Config{Model: testModel, Sim: cfg, Tokenizer: testTokenizer(t), Engine: engine})
	return url
}

// TestResponsesNonStreamed: a Responses answer in vLLM's shape whose
// usage.input_tokens is the engine's /tokenize of the messages vLLM's
// construct_input_messages makes of instructions and input; a
// previous_response_id continuation covers the stored conversation (its
// messages, its output as an assistant message, then the new input) and
// is served from the prefix cache; GET returns the stored response.
func TestResponsesNonStreamed(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	resp, body := post(t, url+"/v1/responses", map[string]any{
		"model": testModel, "instructions": "be brief",
		"input": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": "hello there"},
			map[string]any{"type": "input_text", "text": "second part"}}}},
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var first responseAnswer
	if err := json.Unmarshal(body, &first); err != nil {
		t.Fatal(err)
	}
	want := tokenizeMessages(t, url, []map[string]any{{"role": "system", "content": "be brief"},
		{"role": "user", "content": "hello there\nsecond part"}})
	if !strings.HasPrefix(first.ID, "resp_") || first.Object != "response" || first.Status != "completed" ||
		first.Model != testModel || first.IncompleteDetails != nil || first.MaxOutputTokens != DefaultMaxTokens {
		t.Fatalf("answer %s", body)
	}
	if len(first.Output) != 1 || first.Output[0].Type != "message" || first.Output[0].Role != "assistant" ||
		!strings.HasPrefix(first.Output[0].ID, "msg_") || first.Output[0].Status != "completed" ||
		len(first.Output[0].Content) != 1 || first.Output[0].Content[0].Type != "output_text" ||
		first.Output[0].Content[0].Text != text(DefaultMaxTokens) {
		t.Fatalf("output %s", body)
	}
	if u := first.Usage; u == nil || u.InputTokens != want || u.OutputTokens != DefaultMaxTokens ||
		u.TotalTokens != want+DefaultMaxTokens || u.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v, want input_tokens %d", first.Usage, want)
	}

	// The continuation: the stored conversation, its output, the new input.
	resp, body = post(t, url+"/v1/responses", map[string]any{
		"model": testModel, "input": "and now?", "previous_response_id": first.ID, "max_output_tokens": 3,
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("continuation: %d %s", resp.StatusCode, body)
	}
	var second responseAnswer
	if err := json.Unmarshal(body, &second); err != nil {
		t.Fatal(err)
	}
	want2 := tokenizeMessages(t, url, []map[string]any{{"role": "system", "content": "be brief"},
		{"role": "user", "content": "hello there\nsecond part"},
		{"role": "assistant", "content": text(DefaultMaxTokens)},
		{"role": "user", "content": "and now?"}})
	if second.Usage == nil || second.Usage.InputTokens != want2 || second.Usage.InputTokens <= want {
		t.Fatalf("continuation usage %+v, want input_tokens %d (first %d)", second.Usage, want2, want)
	}
	if second.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("the continuation hit no cached tokens: %s", body)
	}
	if second.Status != "incomplete" || second.IncompleteDetails == nil || second.IncompleteDetails.Reason != "max_output_tokens" ||
		second.MaxOutputTokens != 3 || second.PreviousResponseID == nil || *second.PreviousResponseID != first.ID {
		t.Fatalf("continuation %s", body)
	}

	// GET returns the stored response as answered.
	g, err := http.Get(url + "/v1/responses/" + second.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(g.Body)
	g.Body.Close()
	if g.StatusCode != http.StatusOK || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(body)) {
		t.Fatalf("GET: %d %s\nwant %s", g.StatusCode, got, body)
	}
}

// TestResponsesErrors: an unknown previous_response_id, GET and cancel of
// an unknown id answer vLLM's _make_not_found_error; cancel of a finished
// response 400; store false keeps nothing; bad input 400.
func TestResponsesErrors(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	wantNotFound := func(resp *http.Response, body []byte, id string) {
		t.Helper()
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    int     `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusNotFound || e.Error.Message != "Response with id '"+id+"' not found." ||
			e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != "response_id" || e.Error.Code != 404 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	resp, body := post(t, url+"/v1/responses", map[string]any{"model": testModel, "input": "hi", "previous_response_id": "resp_nope"})
	wantNotFound(resp, body, "resp_nope")
	g, err := http.Get(url + "/v1/responses/resp_gone")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(g.Body)
	g.Body.Close()
	wantNotFound(g, body, "resp_gone")
	resp, body = post(t, url+"/v1/responses/resp_gone/cancel", map[string]any{})
	wantNotFound(resp, body, "resp_gone")

	// store false: answered, not kept.
	resp, body = post(t, url+"/v1/responses", map[string]any{"model": testModel, "input": "hi", "store": false})
	var a responseAnswer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/v1/responses", map[string]any{"model": testModel, "input": "again", "previous_response_id": a.ID})
	wantNotFound(resp, body, a.ID)

	// A kept response cannot be cancelled: it is not a background one.
	resp, body = post(t, url+"/v1/responses", map[string]any{"model": testModel, "input": "hi"})
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/v1/responses/"+a.ID+"/cancel", map[string]any{})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Cannot cancel a synchronous response.") {
		t.Fatalf("cancel: %d %s", resp.StatusCode, body)
	}

	for _, bad := range []string{
		`{"model": "test-model"}`,
		`{"model": "test-model", "input": 7}`,
		`{"model": "test-model", "input": [{"content": "no role"}]}`,
		`{"model": "test-model", "input": "x", "prompt": {"id": "p"}}`,
		`{"model": "test-model", "input": "x", "max_output_tokens": 0}`,
		`{"model": "test-model", "input": "x"`,
	} {
		resp, body := postRaw(t, url+"/v1/responses", []byte(bad))
		var e struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Code != 400 {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, body)
		}
	}
	resp, body = post(t, url+"/v1/responses", map[string]any{"model": "other", "input": "hi"})
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"NotFoundError"`) {
		t.Fatalf("other model: %d %s", resp.StatusCode, body)
	}
}

// TestResponsesStreamed: the event sequence of vLLM's
// responses_stream_generator for a text answer, sequence numbers from 0,
// one delta per token, and response.completed carrying the usage; the
// streamed response is stored.
func TestResponsesStreamed(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	b, _ := json.Marshal(map[string]any{"model": testModel, "input": "stream me", "stream": true, "max_output_tokens": 4})
	resp, err := http.Post(url+"/v1/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := namedEvents(t, resp.Body)
	wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.completed"}
	if len(evs) != len(wantTypes) {
		t.Fatalf("%d events, want %d: %v", len(evs), len(wantTypes), evs)
	}
	var deltas strings.Builder
	var id, itemID string
	for i, ev := range evs {
		var d struct {
			Type     string         `json:"type"`
			Seq      int            `json:"sequence_number"`
			Delta    string         `json:"delta"`
			ItemID   string         `json:"item_id"`
			Text     string         `json:"text"`
			Response responseAnswer `json:"response"`
		}
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, ev.data)
		}
		if ev.typ != wantTypes[i] || d.Type != wantTypes[i] || d.Seq != i {
			t.Fatalf("event %d: %s %s, want %s seq %d", i, ev.typ, ev.data, wantTypes[i], i)
		}
		switch d.Type {
		case "response.created":
			id = d.Response.ID
			if d.Response.Status != "in_progress" || d.Response.Usage != nil || len(d.Response.Output) != 0 {
				t.Fatalf("created: %s", ev.data)
			}
		case "response.output_text.delta":
			deltas.WriteString(d.Delta)
			if itemID == "" {
				itemID = d.ItemID
			} else if d.ItemID != itemID {
				t.Fatalf("item ids %q and %q", itemID, d.ItemID)
			}
		case "response.output_text.done":
			if d.Text != text(4) {
				t.Fatalf("done text %q", d.Text)
			}
		case "response.completed":
			r := d.Response
			want := tokenizeMessages(t, url, []map[string]any{{"role": "user", "content": "stream me"}})
			if r.ID != id || r.Status != "incomplete" || r.Usage == nil || r.Usage.InputTokens != want ||
				r.Usage.OutputTokens != 4 || len(r.Output) != 1 || r.Output[0].Content[0].Text != text(4) {
				t.Fatalf("completed: %s (want input_tokens %d)", ev.data, want)
			}
		}
	}
	if deltas.String() != text(4) {
		t.Fatalf("deltas %q", deltas.String())
	}
	g, err := http.Get(url + "/v1/responses/" + id)
	if err != nil {
		t.Fatal(err)
	}
	g.Body.Close()
	if g.StatusCode != http.StatusOK {
		t.Fatalf("GET streamed response: %d", g.StatusCode)
	}
}

// TestResponseStoreBounded: the store keeps at most maxStoredResponses,
// evicting the oldest.
func TestResponseStoreBounded(t *testing.T) {
	var st responseStore
	for i := range maxStoredResponses + 3 {
		st.put(string(rune('a'+i%26))+strings.Repeat("x", i/26)+"-"+string(rune('0'+i%10)), &storedResponse{body: json.RawMessage("{}")})
	}
	if len(st.byID) != maxStoredResponses || len(st.order) != maxStoredResponses {
		t.Fatalf("%d kept, %d ordered", len(st.byID), len(st.order))
	}
	if st.get("a-0") != nil {
		t.Fatal("the oldest response was kept")
	}
}
