package trace

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// Responses- and Messages-shaped lines are read by the prompt they carry:
// rendered into the chat messages vLLM builds (as router/live keys the
// request), the token estimate and chained 512-token block ids of the
// rendering; the line's output_length, else the request's max tokens.
// A later turn of a conversation extends its earlier turn's ids.
func TestPromptLines(t *testing.T) {
	long := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 60) // 2,700 bytes
	turn1 := `{"timestamp":0,"output_length":5,"instructions":"Be brief.","input":"` + long + `"}`
	turn2 := `{"timestamp":10,"model":"m","max_output_tokens":7,"session_id":"s1","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"` + long + `"}]},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`
	msgs := `{"timestamp":25,"max_tokens":9,"priority":2,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"hi"}]}`
	mooncake := `{"timestamp":30,"input_length":1,"output_length":1,"hash_ids":[42]}`
	recs, err := ReadMooncake(strings.NewReader(strings.Join([]string{turn1, turn2, msgs, mooncake}, "\n")), "p.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records, want 4", len(recs))
	}
	render1 := prefix.RenderChat([]prefix.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: long}})
	render2 := prefix.RenderChat([]prefix.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: long},
		{Role: "assistant", Content: "ok"}, {Role: "user", Content: "more"}})
	render3 := prefix.RenderChat([]prefix.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "hi"}})
	for i, c := range []struct {
		render   string
		out      int
		priority int
		session  string
	}{{render1, 5, 0, ""}, {render2, 7, 0, "s1"}, {render3, 9, 2, ""}} {
		r := recs[i]
		if want := (len(c.render) + 3) / 4; r.InputLength != want {
			t.Errorf("line %d: input_length %d, want %d", i+1, r.InputLength, want)
		}
		if want := (len(c.render) + promptBlockBytes - 1) / promptBlockBytes; len(r.HashIDs) != want {
			t.Errorf("line %d: %d hash ids, want %d", i+1, len(r.HashIDs), want)
		}
		full := prefix.TextBlocks(c.render, MooncakeBlockTokens, prefix.DefaultCharsPerToken)
		if !slices.Equal(r.HashIDs[:len(full)], full) {
			t.Errorf("line %d: leading ids %v, want the rendering's text blocks %v", i+1, r.HashIDs[:len(full)], full)
		}
		if r.OutputLength != c.out || r.Priority != c.priority || r.HasPriority != (c.priority != 0) || r.SessionID != c.session {
			t.Errorf("line %d: output %d priority %d/%v session %q", i+1, r.OutputLength, r.Priority, r.HasPriority, r.SessionID)
		}
	}
	// The first turn's rendering is 2,725 bytes: one full block, shared by
	// the second turn, and a partial block that is not.
	if len(recs[0].HashIDs) != 2 || len(recs[1].HashIDs) != 2 || recs[0].HashIDs[0] != recs[1].HashIDs[0] || recs[0].HashIDs[1] == recs[1].HashIDs[1] {
		t.Errorf("turn ids %v and %v: want the first block shared, the partial one not", recs[0].HashIDs, recs[1].HashIDs)
	}
	if recs[2].Arrival.Milliseconds() != 25 || recs[3].HashIDs[0] != 42 {
		t.Errorf("arrival %v, mooncake ids %v", recs[2].Arrival, recs[3].HashIDs)
	}
}

// A prompt line's errors name the line and the field.
func TestPromptLineErrors(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"input":"x","output_length":1}`, `"timestamp"`},
		{`{"timestamp":0,"input":"x"}`, `"output_length"`},
		{`{"timestamp":0,"output_length":1,"input":5}`, "input"},
		{`{"timestamp":0,"output_length":1,"input":"x","input_length":3}`, "input_length"},
		{`{"timestamp":-1,"output_length":1,"input":"x"}`, "timestamp"},
		{`{"timestamp":0,"output_length":1,"messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{`{"timestamp":0,"output_length":1,"max_tokens":0,"messages":[]}`, "max_tokens"},
		{`{"timestamp":0,"output_length":1,"messages":[],"session_id":5}`, "session_id"},
	} {
		_, err := ReadMooncake(strings.NewReader(c.line), "p.jsonl")
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Line != 1 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want a ParseError of line 1 naming %q", c.line, err, c.want)
		}
	}
}

// TestPromptLineTools: an agentic Responses line is rendered with its
// tools and tool calls, as router serve keys the request: the tools line
// comes first (so the first block differs from the same line without
// tools), and a function_call item and its output lengthen the prompt.
func TestPromptLineTools(t *testing.T) {
	tools := `,"tools":[{"type":"function","name":"weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	call := `,{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"c1","output":"sunny, 21 degrees"}`
	line := func(withTools, withCall bool) string {
		l := `{"timestamp":0,"output_length":3,"input":[{"role":"user","content":"what is the weather in Paris?"}`
		if withCall {
			l += call
		}
		l += `]`
		if withTools {
			l += tools
		}
		return l + `}`
	}
	recs, err := ReadMooncake(strings.NewReader(strings.Join([]string{line(false, false), line(true, false), line(true, true)}, "\n")), "agent.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	plain, withTools, withCall := recs[0], recs[1], recs[2]
	render := prefix.RenderChatTools(`[{"type":"function","function":{"name":"weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`,
		[]prefix.ChatMessage{{Role: "user", Content: "what is the weather in Paris?"}})
	if want := (len(render) + 3) / 4; withTools.InputLength != want {
		t.Errorf("with tools: input_length %d, want %d (%q)", withTools.InputLength, want, render)
	}
	if withTools.InputLength <= plain.InputLength || withTools.HashIDs[0] == plain.HashIDs[0] {
		t.Errorf("tools not rendered: %d tokens (%v) against %d (%v) without", withTools.InputLength, withTools.HashIDs, plain.InputLength, plain.HashIDs)
	}
	if withCall.InputLength <= withTools.InputLength {
		t.Errorf("the function call and its output not rendered: %d tokens, %d without", withCall.InputLength, withTools.InputLength)
	}
}
