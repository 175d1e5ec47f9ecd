package live

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// FuzzParse checks the request parser on any body: checkBody accepts
// exactly the bodies encoding/json finds valid, within the depth limit;
// the fast path (parseFast), on the bodies ParseRequest may give it, and
// the walk (parseStd) agree, as TestParsePathsAgree asks: the same
// accept or refuse, the same error, the same model, stream and routing
// key (cache_salt included); and ParseRequest answers as the walk does. A
// chat key's text is prefix.RenderChatTools of its tools and messages. Seeded with
// BenchmarkParseAdversarial's shapes (600 bytes each) and the bodies of the
// paths' tests.
func FuzzParse(f *testing.F) {
	for _, shape := range adversarialShapes {
		f.Add(shape.build(600), true)
		f.Add(shape.build(600), false)
	}
	for _, body := range []string{
		`{"model":"m","messages":[{"Role":"user","Content":"hello"}]}`,
		`{"model":5,"model":"m","prompt":"x"}`,
		`{"model":"m","messages":5,"messages":[{"role":"user","content":"a"}]}`,
		`{"model":"m","prompt_token_ids":[null],"prompt_token_ids":[1,2],"prompt":"x"}`,
		`{"model":"m","prompt_token_ids":[7],"messages":[{"role":"user","content":5}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","text":5},{"type":"text","text":"b"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":5},{"type":"text","text":"b"}]}]}`,
		`{"model":"m","prompt":"\ud800abc"}`,
		"{\"model\":\"m\",\"prompt\":\"a\xffb\"}",
		`{"model":"m","prompt":"\ud83d\ude00 \u00e9 \" \\ \/ \b\f\n\r\t"}`,
		`{"model":"m","prompt":[[1],[2,3]]}`,
		`{"model":"m","prompt":[[1],2]}`,
		`{"model":"m","prompt":[1,2.5,-0,1e3]}`,
		`{"model":"m","prompt":"x","cache_salt":"s\u00e9"}`,
		`{"model":"m","cache_salt":5,"cache_salt":"s","messages":[{"role":"user","content":"a"}]}`,
		`{"model":"m","prompt":[1],"cache_salt":{"a":1}}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"a","name":"ann"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"reasoning":"r"},{"role":"tool","tool_call_id":"c","content":"x"}]}`,
		`{"model":"m","tools":[],"messages":[{"role":"assistant","tool_calls":[],"reasoning":null,"name":5},{"role":"user","tool_call_id":"c","tool_calls":[1],"reasoning":"r"}]}`,
		`{"model":"m","tools":{"a":1},"messages":[{"role":"tool","tool_call_id":"c\u00e9","name":"\ud800"}]}`,
		`{"model":"m","tools":[1],"prompt_token_ids":[1],"messages":[{"role":"assistant","tool_calls":{"x":1}}]}`,
		"{\"model\":\"m\",\"prompt\":\"x\",\"cache_salt\":\"a\xffb\"}",
		`{"model":"m","prompt":"x","cache_salt":"\ud800"}`,
		`{"model":"m","prompt":["a",null]}`,
		`{"mod\u0065l":"m","stream":true,"prompt":[]}`,
		` {"model":"m","prompt":"x"} `,
		`{"model":"m","prompt":"x"} trailing`,
		`{"model":"m","prompt":NaN}`,
		`[1]`,
		``,
	} {
		f.Add([]byte(body), true)
		f.Add([]byte(body), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		checked := checkBody(body)
		if nesting(body, maxNesting) > maxNesting {
			if checked != errTooDeep {
				t.Fatalf("nested over the limit: checkBody %v, want errTooDeep", checked)
			}
		} else if (checked == nil) != json.Valid(body) {
			t.Fatalf("checkBody %v, but encoding/json finds the body valid: %v", checked, json.Valid(body))
		}
		std, stdErr := parseStd(body, chat)
		if stdErr == nil && std.Key().chat != nil {
			k := std.Key()
			if want := prefix.RenderChatTools(k.tools(), k.messages()); k.text != want {
				t.Fatalf("text %q is not the rendering of its tools and messages %q", k.text, want)
			}
		}
		got, err := ParseRequest(body, schema(chat))
		same(t, "ParseRequest", got, err, std, stdErr)
		if plainText(body) {
			fast, fastErr := parseFast(body, chat)
			same(t, "parseFast", fast, fastErr, std, stdErr)
		}
	})
}

// keyOpts compares routing keys whole.
var keyOpts = cmp.AllowUnexported(RoutingKey{}, chatSpan{}, chatExt{}, msgExt{}, textSpan{})

// same fails t unless a parse (name) answered as the walk did.
func same(t *testing.T, name string, got *CompletionRequest, err error, std *CompletionRequest, stdErr error) {
	t.Helper()
	switch {
	case (err == nil) != (stdErr == nil):
		t.Fatalf("%s: %v; parseStd: %v", name, err, stdErr)
	case err != nil && (!errors.Is(err, ErrBadRequest) || err.Error() != stdErr.Error()):
		t.Fatalf("%s refuses with %q, parseStd with %q", name, err, stdErr)
	case err == nil && (got.Model != std.Model || got.Stream != std.Stream):
		t.Fatalf("%s: model %q stream %v; parseStd: model %q stream %v", name, got.Model, got.Stream, std.Model, std.Stream)
	case err == nil && !cmp.Equal(got.Key(), std.Key(), keyOpts):
		t.Fatalf("%s: key (-parseStd +%s):\n%s", name, name, cmp.Diff(std.Key(), got.Key(), keyOpts))
	}
}
