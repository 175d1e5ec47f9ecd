package live

import (
	"encoding/json"
	"errors"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/router/prefix"
)

func TestRoutingKey(t *testing.T) {
	long := strings.Repeat("abcd", 64) // 256 bytes: 4 blocks of 16 tokens * 4 chars
	for _, tc := range []struct {
		name, body string
		chat       bool
		want       RoutingKey
	}{
		{"chat string", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`, true,
			RoutingKey{text: "system: s\nuser: hi\n", chat: []chatSpan{{6, 10}, {14, 19}}}},
		{"chat parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]}`, true,
			RoutingKey{text: "user: a\nb\n", chat: []chatSpan{{4, 10}}}}, // vLLM joins text parts by "\n"
		{"chat null content", `{"model":"m","messages":[{"role":"assistant","content":null}]}`, true,
			RoutingKey{text: "assistant: \n", chat: []chatSpan{{9, 12}}}},
		{"prompt string", `{"model":"m","prompt":"hello"}`, false, RoutingKey{text: "hello"}},
		{"prompt strings", `{"model":"m","prompt":["a","b"]}`, false, RoutingKey{text: "a\nb"}},
		{"prompt ids", `{"model":"m","prompt":[1,2,3]}`, false, RoutingKey{ids: []int64{1, 2, 3}}},
		{"prompt id batches", `{"model":"m","prompt":[[1,2],[3]]}`, false, RoutingKey{ids: []int64{1, 2, 3}}},
		{"prompt_token_ids win", `{"model":"m","prompt":"x","prompt_token_ids":[7,8]}`, false, RoutingKey{ids: []int64{7, 8}}},
		{"chat prompt_token_ids", `{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_token_ids":[9]}`, true, RoutingKey{ids: []int64{9}}},
		// cache_salt, vLLM's prefix-cache salt, on both endpoints and
		// with every prompt form; null is none, the last one counts.
		{"chat salt", `{"model":"m","cache_salt":"s1","messages":[{"role":"user","content":"hi"}]}`, true,
			RoutingKey{text: "user: hi\n", chat: []chatSpan{{4, 9}}, salt: "s1"}},
		{"prompt salt", `{"model":"m","prompt":"hello","cache_salt":"\u00e9\n"}`, false, RoutingKey{text: "hello", salt: "é\n"}},
		{"ids salt", `{"model":"m","prompt":[1,2],"cache_salt":"x","cache_salt":"y"}`, false, RoutingKey{ids: []int64{1, 2}, salt: "y"}},
		{"prompt_token_ids salt", `{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_token_ids":[9],"cache_salt":"z"}`, true, RoutingKey{ids: []int64{9}, salt: "z"}},
		{"null salt", `{"model":"m","prompt":"hello","cache_salt":null}`, false, RoutingKey{text: "hello"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The fast path and encoding/json's give the same key.
			fast, err := parseFast([]byte(tc.body), tc.chat)
			if err != nil {
				t.Fatalf("fast path: %v", err)
			}
			std, err := parseStd([]byte(tc.body), tc.chat)
			if err != nil {
				t.Fatalf("encoding/json path: %v", err)
			}
			for path, req := range map[string]*CompletionRequest{"fast": fast, "std": std} {
				if diff := cmp.Diff(tc.want, req.Key(), keyOpts); diff != "" {
					t.Errorf("%s: key (-want +got):\n%s", path, diff)
				}
				if req.Model != "m" {
					t.Errorf("%s: model %q", path, req.Model)
				}
			}
		})
	}
	for _, bad := range []struct {
		body string
		chat bool
		msg  string
	}{
		{`{"model":"m","prompt":{}}`, false, "prompt must be a string, an array of strings or an array of token ids"},
		{`{"model":"m","prompt":[{}]}`, false, "prompt[0] must be an integer token id, not a JSON object"},
		{`{"model":"m","prompt":[1,"a"]}`, false, "prompt[1] must be an integer token id, not a JSON string"},
		{`{"model":"m","prompt":[1.0]}`, false, "prompt[0] must be an integer token id, not the number 1.0"},
		{`{"model":"m","prompt":["a",1]}`, false, `"prompt[1]" must not be a JSON number`},
		{`{"model":"m","prompt":[[1],2]}`, false, `"prompt[1]" must not be a JSON number`},
		{`{"model":"m"}`, false, "you must provide a prompt"},
		{`{"model":"m","prompt":null}`, false, "you must provide a prompt"},
		{`{"model":7,"prompt":"x"}`, false, `"model" must not be a JSON number`},
		{`{"prompt":"x"}`, false, "you must provide a model parameter"},
		{`{"model":"m","stream":"yes","prompt":"x"}`, false, `"stream" must not be a JSON string`},
		{`{"model":"m","prompt":"x","prompt_token_ids":[1.5]}`, false, "prompt_token_ids[0] must be an integer token id, not the number 1.5"},
		{`{"model":"m","prompt":"x"} trailing`, false, "body is not valid JSON"},
		// Not strict JSON: fastjson's parser alone would take these; the
		// validation sends them to encoding/json, whose error stands.
		{`{"model":"m","prompt":NaN}`, false, "body is not valid JSON: invalid character 'N'"},
		{"{\"model\":\"m\",\"prompt\":\"a\nb\"}", false, "body is not valid JSON: invalid character '\\n' in string literal"},
		{`{"model":"m","prompt":"\x41"}`, false, "body is not valid JSON: invalid character 'x' in string escape code"},
		{`{"model":"m","max_tokens":007,"prompt":"x"}`, false, "body is not valid JSON: invalid character '0' after object key:value pair"},
		{`{"model":"m","prompt":"x","junk":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, false, "body is nested too deeply: JSON arrays and objects may nest at most 128 levels"},
		{strings.Repeat("[", 400) + strings.Repeat("]", 400), false, "body is nested too deeply"},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), false, "body must be a JSON object, not a JSON array"},
		{`[1]`, false, "body must be a JSON object, not a JSON array"},
		{`{"model":"m","messages":[]}`, true, "messages must be a non-empty array"},
		{`{"model":"m","messages":{}}`, true, `"messages" must not be a JSON object`},
		{`{"model":"m","messages":["hi"]}`, true, `"messages[0]" must not be a JSON string`},
		{`{"model":"m","messages":[{"role":1,"content":"x"}]}`, true, `"messages[0].role" must not be a JSON number`},
		{`{"model":"m","messages":[{"role":"user","content":7}]}`, true, "messages[0].content must be a string or an array of parts"},
		{`{"model":"m","messages":[{"role":"user","content":["x"]}]}`, true, `"messages[0].content[0]" must not be a JSON string`},
		// null elements are refused on both paths (encoding/json alone
		// would read them as zero values).
		{`{"model":"m","messages":[null]}`, true, `"messages[0]" must not be a JSON null`},
		{`{"model":"m","messages":[{"role":"user","content":[null]}]}`, true, `"messages[0].content[0]" must not be a JSON null`},
		{`{"model":"m","prompt":["a",null]}`, false, `"prompt[1]" must not be a JSON null`},
		{`{"model":"m","prompt":[1,null]}`, false, "prompt[1] must be an integer token id, not a JSON null"},
		{`{"model":"m","prompt":[[1],null]}`, false, `"prompt[1]" must not be a JSON null`},
		{`{"model":"m","prompt":"x","prompt_token_ids":[1,null]}`, false, "prompt_token_ids[1] must be an integer token id, not a JSON null"},
		{`{"model":"m","prompt":"x","cache_salt":5}`, false, `"cache_salt" must not be a JSON number`},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":["s"]}`, true, `"cache_salt" must not be a JSON array`},
	} {
		_, err := ParseRequest([]byte(bad.body), schema(bad.chat))
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%.80s: %v, want ErrBadRequest saying %q", bad.body, err, bad.msg)
		}
		if _, err := parseStd([]byte(bad.body), bad.chat); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%.80s: encoding/json path: %v, want ErrBadRequest", bad.body, err)
		} else if strings.Contains(bad.msg, "null") && !strings.Contains(err.Error(), "null") {
			t.Errorf("%.80s: encoding/json path: %v, want it to name the null", bad.body, err)
		}
	}
	tokens, hashes := RoutingKey{text: long}.hash(16, 4, 0)
	if tokens != 64 || len(hashes) != 4 {
		t.Errorf("text: %d tokens, %d blocks; want 64, 4", tokens, len(hashes))
	}
	if diff := cmp.Diff(prefix.TextBlocks(long, 16, 4), hashes); diff != "" {
		t.Errorf("text hashes differ from prefix.TextBlocks (the mock engine's):\n%s", diff)
	}
	_, more := RoutingKey{text: long + "tail of another request"}.hash(16, 4, 0)
	if diff := cmp.Diff(hashes, more[:4]); diff != "" {
		t.Errorf("a shared text prefix does not share its block hashes:\n%s", diff)
	}
	ids := make([]int64, 40)
	for i := range ids {
		ids[i] = int64(i)
	}
	tokens, hashes = RoutingKey{ids: ids}.hash(16, 4, 0)
	if tokens != 40 || len(hashes) != 2 {
		t.Errorf("ids: %d tokens, %d blocks; want 40, 2 (full blocks only)", tokens, len(hashes))
	}
}

// Escaped and non-ASCII content renders as encoding/json decodes it.
func TestContentUnescapesAsEncodingJSON(t *testing.T) {
	for _, raw := range []string{`"plain text"`, `"with \"escapes\" and \n"`, `"héllo wörld"`, `""`, `"a\u00e9b"`, `"\ud83d\ude00 surrogates"`} {
		req, err := ParseRequest([]byte(`{"model":"m","messages":[{"role":"user","content":`+raw+`}]}`), APIChat)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		var want string
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			t.Fatal(err)
		}
		if got := req.Key().text; got != "user: "+want+"\n" {
			t.Errorf("%s: got %q, want %q", raw, got, "user: "+want+"\n")
		}
	}
}

// The rendered chat text is prefix.RenderChat's, which the mock engine
// hashes too.
func TestChatTextIsRenderChat(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}`
	req, err := ParseRequest([]byte(body), APIChat)
	if err != nil {
		t.Fatal(err)
	}
	want := prefix.RenderChat([]prefix.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "a\nb"}, {Role: "assistant"}})
	if got := req.Key().text; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	msgs := []prefix.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "a\nb"}, {Role: "assistant"}}
	if got := req.Key().messages(); !cmp.Equal(got, msgs) {
		t.Errorf("messages (-want +got):\n%s", cmp.Diff(msgs, got))
	}
	// The large-body walk gives the same spans.
	std, err := parseStd([]byte(body), true)
	if err != nil {
		t.Fatal(err)
	}
	if got := std.Key().messages(); !cmp.Equal(got, msgs) {
		t.Errorf("parseStd messages (-want +got):\n%s", cmp.Diff(msgs, got))
	}
}

func TestUsageTokens(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int64
		ok   bool
	}{
		{`{"id":"x","usage":{"prompt_tokens":250,"completion_tokens":5,"total_tokens":255}}`, 255, true},
		{`{"id":"x"}`, 0, false},
		{`not json`, 0, false},
		{`{"usage":{"total_tokens":"12"}}`, 0, false},
		{`{"usage":null}`, 0, false},
		{``, 0, false},
		{`{"usage":{"total_tokens":7},"x":` + strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting) + `}`, 0, false},
		{`{"usage":{"total_tokens":7},"x":` + strings.Repeat("[", maxNesting-1) + strings.Repeat("]", maxNesting-1) + `}`, 7, true},
		{`{"usage":{"total_tokens":7},"x":tru` + strings.Repeat("e", 1000), 0, false},
	} {
		if u := readUsage([]byte(tc.body)); u.total != tc.want || u.ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.body, u.total, u.ok, tc.want, tc.ok)
		}
	}
	// vLLM's usage with prefix caching: the cached part of the prompt.
	u := readUsage([]byte(`{"usage":{"prompt_tokens":250,"total_tokens":255,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":192}}}`))
	if u != (usage{prompt: 250, cached: 192, completion: 5, total: 255, ok: true, hasCached: true, hasPrompt: true}) {
		t.Errorf("usage = %+v", u)
	}
	if u := readUsage([]byte(`{"usage":{"prompt_tokens":-3,"completion_tokens":2}}`)); u != (usage{completion: 2, ok: true}) {
		t.Errorf("negative counts: %+v", u)
	}
}

func TestStreamUsage(t *testing.T) {
	for _, tc := range []struct {
		chunk string
		want  usage
	}{
		{"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n",
			usage{prompt: 10, cached: 8, completion: 3, total: 13, ok: true, hasCached: true, hasPrompt: true}},
		// continuous usage: the last event's counts.
		{"data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2}}\n\n",
			usage{prompt: 10, completion: 2, ok: true, hasPrompt: true}},
		{"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n", usage{}},
		{"data: {\"usage\":{\"prompt_tokens\":10", usage{}}, // cut mid-event
		{"event: x\n\n", usage{}},
	} {
		if got := streamUsage([]byte(tc.chunk)); got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.chunk, got, tc.want)
		}
	}
}

// A key given twice is read as its last value on both paths, as
// encoding/json and the engines' Python decoders read it.
func TestDuplicateKeysReadTheLast(t *testing.T) {
	body := `{"model":"first","stream":false,"model":"m","stream":true,"messages":[{"role":"x","content":"a","role":"user","content":"b"}]}`
	fast, err := parseFast([]byte(body), true)
	if err != nil {
		t.Fatalf("fast path: %v", err)
	}
	std, err := parseStd([]byte(body), true)
	if err != nil {
		t.Fatal(err)
	}
	for path, req := range map[string]*CompletionRequest{"fast": fast, "std": std} {
		if req.Model != "m" || !req.Stream || req.Key().text != "user: b\n" {
			t.Errorf("%s: model %q stream %v text %q; want the last of each key", path, req.Model, req.Stream, req.Key().text)
		}
	}
}

// A large body, or one of many small JSON values, is parsed within a
// small multiple of its size (fastjson would keep a node per value:
// ~600 MiB for 4 MiB of zeros). What is measured is the peak of the heap's
// live objects, sampled while the parse runs with the collector set to
// run often.
func TestLargeBodiesParseInBoundedMemory(t *testing.T) {
	zeros := strings.Repeat("0,", 2<<20)
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	for _, tc := range []struct {
		name, body string
		chat       bool
		factor     uint64
	}{
		{"ignored array", `{"model":"m","prompt":"x","junk":[` + zeros + `0]}`, false, 8},
		{"token ids", `{"model":"m","prompt":[` + zeros + `0]}`, false, 16},
		{"empty messages", `{"model":"m","messages":[` + strings.Repeat("{},", 1<<20) + `{"role":"user","content":"x"}]}`, true, 8},
		{"many values, small", `{"model":"m","prompt":"x","junk":[` + strings.Repeat("[],", fastMaxValues/2+1) + `0]}`, false, 8},
		{"nested token ids", `{"model":"m","prompt":[` + strings.Repeat("[0],", 1<<20) + `[0]]}`, false, 8},
		{"string array", `{"model":"m","prompt":[` + strings.Repeat(`"",`, 1<<20) + `""]}`, false, 8},
		{"content parts", `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat("{},", 1<<20) + `{}]}]}`, true, 8},
	} {
		body := []byte(tc.body)
		runtime.GC()
		base := liveHeap()
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				if h := liveHeap(); h > peak.Load() {
					peak.Store(h)
				}
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Microsecond):
				}
			}
		}()
		req, err := ParseRequest(body, schema(tc.chat))
		close(stop)
		<-sampled
		if err != nil || req.Model != "m" {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, limit := peak.Load()-min(base, peak.Load()), tc.factor*uint64(len(body)); got > limit {
			t.Errorf("%s: the live heap grew by %d bytes for a %d-byte body, want <= %d", tc.name, got, len(body), limit)
		}
	}
}

// liveHeap is the heap's bytes in objects, live or not yet swept.
func liveHeap() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// The two paths agree on what they accept and on the key, so a request
// routes the same whatever its size: exact key names, the last of a
// duplicated key (only it is checked), messages not read when token ids
// route, a non-text part's text ignored; and encoding/json's strings
// (U+FFFD for invalid UTF-8 and lone surrogates), which ParseRequest
// gets by sending such bodies to parseStd.
func TestParsePathsAgree(t *testing.T) {
	for _, tc := range []struct {
		body string
		chat bool
		want RoutingKey // when accepted
		ok   bool
	}{
		{`{"model":"m","messages":[{"Role":"user","Content":"hello"}]}`, true, RoutingKey{text: ": \n", chat: []chatSpan{{0, 3}}}, true},
		{`{"model":5,"model":"m","prompt":"x"}`, false, RoutingKey{text: "x"}, true},
		{`{"model":"m","stream":"yes","stream":true,"prompt":"x"}`, false, RoutingKey{text: "x"}, true},
		{`{"model":"m","messages":5,"messages":[{"role":"user","content":"a"}]}`, true, RoutingKey{text: "user: a\n", chat: []chatSpan{{4, 8}}}, true},
		{`{"model":"m","prompt_token_ids":[null],"prompt_token_ids":[1,2],"prompt":"x"}`, false, RoutingKey{ids: []int64{1, 2}}, true},
		{`{"model":"m","prompt_token_ids":[7],"messages":[{"role":"user","content":5}]}`, true, RoutingKey{ids: []int64{7}}, true},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","text":5},{"type":"text","text":"b"}]}]}`, true, RoutingKey{text: "user: b\n", chat: []chatSpan{{4, 8}}}, true},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, true, RoutingKey{text: "user: \n", chat: []chatSpan{{4, 7}}}, true},
		// Text parts joined by "\n"; a part whose text is not a string is no part.
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":5},{"type":"text","text":"b"}]}]}`, true, RoutingKey{text: "user: a\nb\n", chat: []chatSpan{{4, 10}}}, true},
		{`{"model":"m","prompt":"\ud800abc"}`, false, RoutingKey{text: "\uFFFDabc"}, true},
		{"{\"model\":\"m\",\"prompt\":\"a\xffb\"}", false, RoutingKey{text: "a\uFFFDb"}, true},
		{`{"model":"m","prompt":"\ud83d\ude00"}`, false, RoutingKey{text: "😀"}, true},
		{`{"model":"m","prompt":[[1],[2,3]]}`, false, RoutingKey{ids: []int64{1, 2, 3}}, true},
		{`{"model":"m","prompt":[[1],2]}`, false, RoutingKey{}, false},
		{`{"model":"m","prompt":[1,2.5]}`, false, RoutingKey{}, false},
		{`{"model":"m","messages":[{"role":"user","content":[null]}]}`, true, RoutingKey{}, false},
	} {
		got, err := ParseRequest([]byte(tc.body), schema(tc.chat))
		std, stdErr := parseStd([]byte(tc.body), tc.chat)
		if (err == nil) != tc.ok || (stdErr == nil) != tc.ok {
			t.Errorf("%s: ParseRequest %v, parseStd %v; want accepted %v", tc.body, err, stdErr, tc.ok)
			continue
		}
		if !tc.ok {
			continue
		}
		for path, req := range map[string]*CompletionRequest{"ParseRequest": got, "parseStd": std} {
			if diff := cmp.Diff(tc.want, req.Key(), keyOpts); diff != "" {
				t.Errorf("%s: %s key (-want +got):\n%s", tc.body, path, diff)
			}
		}
		if plainText([]byte(tc.body)) {
			fast, ferr := parseFast([]byte(tc.body), tc.chat)
			if ferr != nil || !cmp.Equal(fast.Key(), std.Key(), keyOpts) {
				t.Errorf("%s: fast path %v %+v, want the walk's key %+v", tc.body, ferr, fast, std.Key())
			}
		}
	}
}

// A body nested maxNesting levels is read; one level more is refused with
// errTooDeep, on both paths and through ParseRequest, arrays and objects
// alike. Brackets inside strings do not count.
func TestNestingLimit(t *testing.T) {
	paths := map[string]func([]byte, bool) (*CompletionRequest, error){"fast": parseFast, "std": parseStd, "ParseRequest": func(b []byte, chat bool) (*CompletionRequest, error) { return ParseRequest(b, schema(chat)) }}
	for _, open := range []byte{'[', '{'} {
		for _, depth := range []int{maxNesting - 1, maxNesting, maxNesting + 1} {
			// The top-level object is level 1, the junk member's value 2.
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"junk":` + nested(open, depth-1) + `}`)
			if got := nesting(body, maxNesting+10); got != depth {
				t.Fatalf("%c %d: nesting counts %d", open, depth, got)
			}
			for name, parse := range paths {
				req, err := parse(body, true)
				switch {
				case depth <= maxNesting && (err != nil || req.Key().text != "user: x\n"):
					t.Errorf("%s, %c nested %d levels: %v, want it read", name, open, depth, err)
				case depth > maxNesting && (!errors.Is(err, ErrBadRequest) || err.Error() != errTooDeep.Error()):
					t.Errorf("%s, %c nested %d levels: %v, want %v", name, open, depth, err, errTooDeep)
				}
			}
		}
	}
	deepText := strings.Repeat(`[{\"`, 2*maxNesting)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + deepText + `"}]}`)
	for name, parse := range paths {
		if req, err := parse(body, true); err != nil || req.Key().text != "user: "+strings.ReplaceAll(deepText, `\"`, `"`)+"\n" {
			t.Errorf("%s: brackets in a string: %v", name, err)
		}
	}
}
