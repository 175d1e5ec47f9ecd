package live

import (
	"errors"
	"strings"
	"testing"
)

// TestParsePool: the model and the inputs' size of each pooling and
// scoring schema (vLLM's and SGLang's field names), at 4 characters per
// token.
func TestParsePool(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		model      string
		tokens     int
	}{
		{"embeddings string", `{"model":"e","input":"abcdefgh"}`, "e", 2},
		{"embeddings batch summed", `{"model":"e","input":["abcd","abcde","a"]}`, "e", 1 + 2 + 1},
		{"token ids by their length", `{"model":"e","input":[1,2,3,4,5]}`, "e", 5},
		{"batched token ids summed", `{"model":"e","input":[[1,2],[3,4,5]],"encoding_format":"float"}`, "e", 5},
		{"chat embeddings: values, not keys", `{"model":"e","messages":[{"role":"user","content":"abcdefgh"}]}`, "e", 1 + 2},
		{"score text_1 text_2", `{"model":"s","text_1":"abcd","text_2":["abcd","abcdefgh"]}`, "s", 1 + 1 + 2},
		{"rerank query and documents", `{"model":"r","query":"abcd","documents":["abcd","abcd"],"top_n":5}`, "r", 3},
		{"sglang score query and items", `{"model":"r","query":"abcd","items":["abcd"]}`, "r", 2},
		{"options do not count", `{"model":"e","input":"abcd","dimensions":1024,"user":"abcdefghijkl"}`, "e", 1},
		{"key given twice: the last", `{"model":"a","input":"abcdefghijkl","model":"b","input":"abcd"}`, "b", 1},
		{"no inputs: 1", `{"model":"e"}`, "e", 1},
		{"no model", `{"input":"abcd"}`, "", 1},
		{"null model", `{"model":null,"input":"abcd"}`, "", 1},
		{"escaped quote inside a string", `{"model":"e","input":"ab\"cd:"}`, "e", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePool([]byte(tt.body), 4)
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != tt.model || got.Tokens != tt.tokens {
				t.Errorf("parsePool = %+v, want model %q, %d tokens", got, tt.model, tt.tokens)
			}
		})
	}
}

// TestParsePoolErrors: bad bodies are ErrBadRequest naming what is wrong.
func TestParsePoolErrors(t *testing.T) {
	for _, tt := range []struct{ name, body, want string }{
		{"not json", `{"model":`, "not valid JSON"},
		{"not an object", `["a"]`, "must be a JSON object, not a JSON array"},
		{"model a number", `{"model":5}`, `"model" must not be a JSON number`},
		{"too deep", `{"input":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, "nested too deeply"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parsePool([]byte(tt.body), 4)
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want ErrBadRequest with %q", err, tt.want)
			}
		})
	}
}

// TestParsePoolAdversarial: bodies built to make a parser work hard
// (millions of values, a deep-but-allowed nesting repeated, megabytes of
// escapes) are read, and counted right: with a reading quadratic in the
// body (or in depth times the body) they would not finish within the
// test's timeout.
func TestParsePoolAdversarial(t *testing.T) {
	zeros := `{"model":"e","input":[` + strings.Repeat("0,", 2<<20) + `0]}`
	nested := `{"model":"e","input":[` + strings.Repeat(strings.Repeat("[", 120)+"1"+strings.Repeat("]", 120)+",", 20000) + `1]}`
	escapes := `{"model":"e","input":"` + strings.Repeat(`\\`, 4<<20) + `"}`
	for _, tt := range []struct {
		name, body string
		tokens     int
	}{
		{"4 MiB of token ids", zeros, 2<<20 + 1},
		{"deep arrays repeated", nested, 20001},
		{"8 MiB of escapes", escapes, (8 << 20) / 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePool([]byte(tt.body), 4)
			if err != nil {
				t.Fatal(err)
			}
			if got.Tokens != tt.tokens || got.Model != "e" {
				t.Errorf("parsePool = %+v, want %d tokens", got, tt.tokens)
			}
		})
	}
	// Strings with escaped quotes are skipped whole, keys apart from
	// values.
	for _, n := range []int{1 << 10, 1 << 14} {
		raw := "[" + strings.Repeat(`"ab\"c",`, n) + `""]`
		if got := valueTokens(raw, 4); got != 2*n {
			t.Errorf("valueTokens of %d escaped strings = %d, want %d", n, got, 2*n)
		}
	}
}

// FuzzParsePool: any body is parsed without a panic; an accepted one has
// at least 1 token, and a model only when the body is an object.
func FuzzParsePool(f *testing.F) {
	for _, s := range []string{`{"model":"e","input":"abc"}`, `{"model":"e","input":[[1,2],[3]]}`, `{"query":"a","documents":[{"text":"b"}]}`,
		`{"model":"e","input":"a\"b\\"}`, `[`, `{"model":1}`, `{"input":-1.5e3}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parsePool(body, 3)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		if got.Tokens < 1 || got.Tokens > len(body)+1 {
			t.Fatalf("tokens %d of a %d-byte body", got.Tokens, len(body))
		}
	})
}
