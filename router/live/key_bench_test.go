package live

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// adversarialShape is a kind of request body of BenchmarkParseAdversarial
// and FuzzParse's seeds.
type adversarialShape struct {
	name  string
	build func(size int) []byte // a body of about size bytes
	ok    bool                  // ParseRequest accepts it (as a chat request)
}

// chatPrefix opens an ordinary chat body whose last member is left for
// the caller to fill.
const chatPrefix = `{"model":"m","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"hi"}],`

// fill returns a builder of head, then unit repeated to bring the body to
// about size bytes, then tail.
func fill(head, unit, tail string) func(int) []byte {
	return func(size int) []byte {
		n := max(1, (size-len(head)-len(tail))/len(unit))
		var b bytes.Buffer
		b.Grow(len(head) + n*len(unit) + len(tail))
		b.WriteString(head)
		for range n {
			b.WriteString(unit)
		}
		b.WriteString(tail)
		return b.Bytes()
	}
}

// nested returns a JSON value nesting depth levels of arrays ("[") or of
// objects ("{"), around 0.
func nested(open byte, depth int) string {
	if open == '[' {
		return strings.Repeat("[", depth) + "0" + strings.Repeat("]", depth)
	}
	return strings.Repeat(`{"a":`, depth) + "0" + strings.Repeat("}", depth)
}

// at is a member of the "junk" array of the deep shapes that takes the
// body to depth levels: the top-level object is level 1, the array
// level 2.
func at(open byte, depth int) string { return nested(open, depth-2) + "," }

// adversarialShapes are an ordinary chat body (the best case) and shapes
// meant to cost the parser most per byte.
var adversarialShapes = []adversarialShape{
	{"chat", fill(`{"model":"m","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},`,
		`{"role":"user","content":"Summarise the switchyard benchmark notes, please, in a few short lines."},`+
			`{"role":"assistant","content":"The notes measure the router's own work per request, its selection cost and its memory."},`,
		`{"role":"user","content":"Thanks."}]}`), true},
	// An agent's conversation: a tools list, tool calls and their
	// results (the walk reads it: parseFast declines it).
	{"agentic chat", fill(`{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","description":"The weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],`+
		`"messages":[{"role":"system","content":"You are a helpful assistant."},`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},`+
			`{"role":"tool","tool_call_id":"call_1","content":"18C and sunny over the city, light wind."},`,
		`{"role":"user","content":"Thanks."}]}`), true},
	{"chat, one escaped emoji", fill(`{"model":"m","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant \ud83d\ude00."},`,
		`{"role":"user","content":"Summarise the switchyard benchmark notes, please, in a few short lines."},`+
			`{"role":"assistant","content":"The notes measure the router's own work per request, its selection cost and its memory."},`,
		`{"role":"user","content":"Thanks."}]}`), true},
	{"deep arrays at the limit", fill(chatPrefix+`"junk":[`, at('[', maxNesting), "0]}"), true},
	{"deep arrays over the limit at the end", fill(chatPrefix+`"junk":[`, at('[', maxNesting-1), at('[', maxNesting+1)+"0]}"), false},
	{"deep arrays unclosed", fill("", "[", ""), false},
	{"deep arrays unclosed at the limit", fill(chatPrefix+`"junk":[`, at('[', maxNesting), strings.Repeat("[", maxNesting-2)), false},
	{"deep objects at the limit", fill(chatPrefix+`"junk":[`, at('{', maxNesting), "0]}"), true},
	{"deep objects over the limit at the end", fill(chatPrefix+`"junk":[`, at('{', maxNesting-1), at('{', maxNesting+1)+"0]}"), false},
	{"deep objects unclosed", fill(`{"model":"m","messages":[],"junk":`, `{"a":`, ""), false},
	{"deep objects unclosed at the limit", fill(chatPrefix+`"junk":[`, at('{', maxNesting), strings.Repeat(`{"a":`, maxNesting-2)), false},
	{"bad literal at the limit, long tail", fill(chatPrefix+`"junk":`+strings.Repeat("[", maxNesting-2)+"t", "\x01", ""), false},
	{`\u escapes`, fill(`{"model":"m","messages":[{"role":"user","content":"`, `\u00e9\u4e2d`, `"}]}`), true},
	{`\u surrogate pairs`, fill(`{"model":"m","messages":[{"role":"user","content":"`, `\ud83d\ude00`, `"}]}`), true},
	{`\" and \\ escapes`, fill(`{"model":"m","messages":[{"role":"user","content":"`, `\"\\\n\t`, `"}]}`), true},
	{"escapes unclosed", fill(`{"model":"m","messages":[{"role":"user","content":"`, `\"\\`, ""), false},
	{"many keys", manyKeys(`{"model":"m","messages":[{"role":"user","content":"hi"}],`, `}`), true},
	{"many keys in a message", manyKeys(`{"model":"m","messages":[{"role":"user","content":"hi",`, `}]}`), true},
	{"many messages", fill(`{"model":"m","messages":[`, `{"role":"user","content":"x"},`, `{}]}`), true},
	{"empty arrays", fill(chatPrefix+`"junk":[`, `[],`, `[]]}`), true},
	{"zeros", fill(chatPrefix+`"junk":[`, `0,`, `0]}`), true},
	{"token ids", fill(`{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_token_ids":[`, `12345,`, `0]}`), true},
}

// manyKeys returns a builder of head, distinct keys with short values to
// about size bytes, then tail.
func manyKeys(head, tail string) func(int) []byte {
	return func(size int) []byte {
		var b bytes.Buffer
		b.Grow(size + 32)
		b.WriteString(head)
		for i := 0; b.Len() < size-len(tail)-16; i++ {
			b.WriteString(`"k`)
			b.WriteString(strconv.Itoa(i))
			b.WriteString(`":0,`)
		}
		b.WriteString(`"k":0`)
		b.WriteString(tail)
		return b.Bytes()
	}
}

// BenchmarkParseAdversarial parses request bodies of 32 KiB, 1 MiB and
// the body size limit (DefaultMaxBodyBytes) as the handler does
// (ParseRequest, chat), an ordinary chat body against shapes built to
// cost most per byte: deep nesting at, over and unclosed below the depth
// limit, long runs of escapes, many keys, many values. ns/byte is the
// figure to compare (BENCHMARKS.md): the worst shape must stay within 10x
// the ordinary body of the same size.
func BenchmarkParseAdversarial(b *testing.B) {
	for _, size := range []int{32 << 10, 1 << 20, DefaultMaxBodyBytes} {
		for _, tc := range adversarialShapes {
			b.Run(fmt.Sprintf("%s/%s", sizeName(size), tc.name), func(b *testing.B) {
				body := tc.build(size)
				if len(body) > DefaultMaxBodyBytes {
					b.Fatalf("%d-byte body over the size limit", len(body))
				}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					_, err := ParseRequest(body, APIChat)
					if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadRequest)) {
						b.Fatalf("accepted %v, want %v: %v", err == nil, tc.ok, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(body)), "ns/byte")
			})
		}
	}
}

func sizeName(size int) string {
	if size >= 1<<20 {
		return strconv.Itoa(size>>20) + "MiB"
	}
	return strconv.Itoa(size>>10) + "KiB"
}
