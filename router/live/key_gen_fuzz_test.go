package live

import (
	"errors"
	"slices"
	"testing"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// FuzzParseGen checks the Responses and Messages parser on any body: it
// never panics, every error wraps ErrBadRequest, an accepted body's key
// spans lie in its text and end at its end, the text is
// prefix.RenderChatTools of the key's tools and messages, and the same body always
// gives the same key. Seeded with genCases' bodies and
// TestGenBadBodies' shapes.
func FuzzParseGen(f *testing.F) {
	for _, c := range genCases {
		f.Add([]byte(c.body), c.api == APIResponses)
	}
	for _, body := range []string{
		`{"model":"m","input":[{"type":"function_call"},{"type":"reasoning"},{"role":"assistant","content":[]}]}`,
		`{"model":"m","input":[{"role":"assistant","content":[5]}]}`,
		`{"model":"m","max_tokens":1e3,"messages":[{"role":"ctx","content":[{"type":"tool_result","content":[{"type":"image"},{"type":"tool_reference","name":"x"}]}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"a":1}]}]}]}`,
		`{"model":"m","input":"\ud800","instructions":"a\u0000b"}`,
		"{\"model\":\"m\",\"input\":\"a\xffb\"}",
		`{"model":"m","input":[],"input":"x","model":"n"}`,
		`{"model":"m","tools":[{"type":"function","name":"f"},{"type":"x"},5],"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"reasoning","summary":["s"]},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{},"description":null},{"name":5}],"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":""},{"type":"tool_use","id":"t","name":"f","input":{"a":[1, 2]}}]}]}`,
		`[]`, ``, `{`,
	} {
		f.Add([]byte(body), true)
		f.Add([]byte(body), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, responses bool) {
		api := APIMessages
		if responses {
			api = APIResponses
		}
		req, err := ParseRequest(body, api)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		k := req.Key()
		if want := prefix.RenderChatTools(k.tools(), k.messages()); k.text != want {
			t.Fatalf("text %q is not the rendering of its tools and messages %q", k.text, want)
		}
		var start uint32
		if k.ext != nil {
			start = k.ext.toolsEnd
		}
		for _, sp := range k.chat {
			if sp.roleEnd < start || sp.end < sp.roleEnd+3 || int(sp.end) > len(k.text) {
				t.Fatalf("span %+v out of the text (%d bytes, from %d)", sp, len(k.text), start)
			}
			start = sp.end
		}
		if int(start) != len(k.text) {
			t.Fatalf("spans end at %d, text is %d bytes", start, len(k.text))
		}
		again, err := ParseRequest(body, api)
		if err != nil {
			t.Fatalf("second parse: %v", err)
		}
		k2 := again.Key()
		if k2.text != k.text || !slices.Equal(k2.chat, k.chat) || k2.salt != k.salt || again.Model != req.Model ||
			again.Stream != req.Stream || again.PreviousResponseID != req.PreviousResponseID {
			t.Fatalf("the same body gave two keys")
		}
	})
}
