package live

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

// formBody builds a multipart/form-data body as Go's mime/multipart
// writes it (the same wire shape as curl -F and the OpenAI SDKs: CRLF
// lines, a Content-Disposition per part): fields are name, value pairs;
// a name starting with "@" is a file part of that name (without the @)
// whose content is the value. It returns the body and its Content-Type.
func formBody(t testing.TB, fields ...string) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		name, value := fields[i], fields[i+1]
		var (
			pw  io.Writer
			err error
		)
		if file, ok := strings.CutPrefix(name, "@"); ok {
			pw, err = w.CreateFormFile(file, "a.wav")
		} else {
			pw, err = w.CreateFormField(name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(pw, value); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), w.FormDataContentType()
}

// newFormRuntime is a runtime with only what ParsePoolBody reads: 4
// characters a token, a 64 MiB body bound.
func newFormRuntime() *Runtime { return &Runtime{cpt: 4, maxBody: 64 << 20} }

// TestParsePoolBodyForm: a multipart/form-data body's "model" is read
// wherever its part is (before the file, after a large file, among other
// fields), its size is the body's length at 4 characters a token, and a
// JSON body is still read as JSON.
func TestParsePoolBodyForm(t *testing.T) {
	rt := newFormRuntime()
	audio := strings.Repeat("RIFF\r\n--not-the-boundary\r\n", 40000) // ~1 MiB, with CRLFs and dashes
	for _, tt := range []struct {
		name   string
		api    API
		fields []string
		model  string
	}{
		{"model before the file (OpenAI Python SDK)", APIAudio, []string{"model", "whisper", "@file", audio}, "whisper"},
		{"model after a large file (curl -F file=@ -F model=, the Node SDK)", APIAudio, []string{"@file", audio, "model", "whisper", "language", "en"}, "whisper"},
		{"among fields", APIOther, []string{"language", "en", "model", "llama", "response_format", "json", "@file", "x"}, "llama"},
		{"given twice: the last, as Starlette's FormData", APIAudio, []string{"model", "a", "@file", audio, "model", "b"}, "b"},
		{"empty value names none, as FastAPI reads it", APIAudio, []string{"model", "", "@file", "x"}, ""},
		{"no model part", APIOther, []string{"@file", "x", "prompt", "hello"}, ""},
		{"a field called models is not model", APIOther, []string{"models", "x"}, ""},
		{"unicode model", APIAudio, []string{"model", "wh\u00efsper/\u00e9", "@file", "x"}, "wh\u00efsper/\u00e9"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body, ct := formBody(t, tt.fields...)
			got, err := rt.ParsePoolBody(tt.api, ct, body)
			if err != nil {
				t.Fatal(err)
			}
			want := (len(body) + 3) / 4 // a pass-through form: at characters per token
			if tt.api == APIAudio {
				want = (len(body) + AudioBytesPerToken - 1) / AudioBytesPerToken
			}
			if got.Model != tt.model || got.Tokens != want {
				t.Errorf("ParsePoolBody = %+v, want model %q, %d tokens", got, tt.model, want)
			}
			// Go's own reader finds the same last model.
			r := multipart.NewReader(bytes.NewReader(body), ct[strings.Index(ct, "boundary=")+len("boundary="):])
			wantModel := ""
			for {
				p, err := r.NextPart()
				if err != nil {
					break
				}
				if p.FormName() == "model" {
					b, _ := io.ReadAll(p)
					wantModel = string(b)
				}
			}
			if wantModel != tt.model {
				t.Errorf("mime/multipart reads model %q, the test wants %q", wantModel, tt.model)
			}
		})
	}
	// A JSON body, to a pass-through path, of any other content type.
	for _, ct := range []string{"application/json", "", "text/plain", "not a media type;;"} {
		got, err := rt.ParsePoolBody(APIOther, ct, []byte(`{"model":"m","input":"abcdefgh"}`))
		if err != nil || got.Model != "m" || got.Tokens != 2 {
			t.Errorf("JSON with Content-Type %q: %+v, %v; want model m, 2 tokens", ct, got, err)
		}
	}
	// Pooling endpoints take JSON only: a form body there is not JSON.
	body, ct := formBody(t, "model", "m")
	if _, err := rt.ParsePoolBody(APIPool, ct, body); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("a form to a pooling endpoint: %v, want not valid JSON", err)
	}
}

// TestParsePoolBodyHandWritten: bodies as other clients write them, by
// hand: a preamble and an epilogue, transport padding after a delimiter,
// a quoted boundary, lower-case header names,
// the boundary's text inside a part's data (not followed by CRLF or
// "--"), an RFC 2231 filename.
func TestParsePoolBodyHandWritten(t *testing.T) {
	rt := newFormRuntime()
	for _, tt := range []struct {
		name, ct, body, model string
	}{
		{"preamble, epilogue, padding", `multipart/form-data; boundary=XyZ`,
			"ignored preamble\r\n--XyZ  \t\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nm1\r\n--XyZ--\r\nepilogue", "m1"},
		{"quoted boundary with RFC 2046 characters", `multipart/form-data; boundary="a'()+_,-./:=? b"`,
			"--a'()+_,-./:=? b\r\nContent-Disposition: form-data; name=model\r\n\r\nm2\r\n--a'()+_,-./:=? b--", "m2"},
		{"the boundary inside data", `multipart/form-data; boundary=b`,
			"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--bb\r\n--b.y\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm4\r\n--b--", "m4"},
		{"model value with CRLF inside", `multipart/form-data; boundary=b`,
			"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n5\r\n--b--", "m\r\n5"},
		{"upper-case media type", `Multipart/Form-Data; boundary=b`,
			"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm6\r\n--b--", "m6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := rt.ParsePoolBody(APIAudio, tt.ct, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != tt.model {
				t.Errorf("model %q, want %q", got.Model, tt.model)
			}
			// Go's own reader agrees.
			_, bd, _ := formBoundary(tt.ct)
			r := multipart.NewReader(strings.NewReader(tt.body), bd)
			wantModel := ""
			for {
				p, err := r.NextPart()
				if err != nil {
					if err != io.EOF {
						t.Fatalf("mime/multipart: %v", err)
					}
					break
				}
				if p.FormName() == "model" {
					b, _ := io.ReadAll(p)
					wantModel = string(b)
				}
			}
			if wantModel != tt.model {
				t.Errorf("mime/multipart reads model %q, the test wants %q", wantModel, tt.model)
			}
		})
	}
}

// TestParsePoolBodyFormErrors: malformed forms, and a speech-to-text
// body that is not a form, are ErrBadRequest naming what is wrong.
func TestParsePoolBodyFormErrors(t *testing.T) {
	rt := newFormRuntime()
	good, goodCT := formBody(t, "model", "m", "@file", "abc")
	const b = "multipart/form-data; boundary=b"
	for _, tt := range []struct {
		name string
		api  API
		ct   string
		body string
		want string
	}{
		{"no boundary", APIAudio, "multipart/form-data", string(good), "has no boundary parameter"},
		{"empty boundary", APIOther, `multipart/form-data; boundary=""`, string(good), "has no boundary parameter"},
		{"boundary over 70 bytes", APIAudio, "multipart/form-data; boundary=" + strings.Repeat("a", 71), string(good), "not one RFC 2046 allows"},
		{"boundary with a forbidden character", APIAudio, `multipart/form-data; boundary="a;b"`, string(good), "not one RFC 2046 allows"},
		{"Content-Type does not parse", APIAudio, "multipart/form-data; boundary=a; boundary=b", string(good), "does not parse"},
		{"wrong boundary", APIAudio, "multipart/form-data; boundary=other", string(good), "no delimiter line"},
		{"JSON to speech to text", APIAudio, "application/json", `{"model":"m"}`, `body is multipart/form-data`},
		{"no Content-Type to speech to text", APIAudio, "", `{"model":"m"}`, `not "no Content-Type"`},
		{"cut before the closing delimiter", APIAudio, goodCT, string(good[:len(good)-10]), "is not closed"},
		{"no closing delimiter at all", APIAudio, b, "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm", "part 1 is not closed"},
		{"headers without their empty line", APIAudio, b, "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n--b--", "headers do not end"},
		{"no Content-Disposition", APIAudio, b, "--b\r\nContent-Type: text/plain\r\n\r\nm\r\n--b--", "no Content-Disposition"},
		{"a part without headers (Starlette refuses it too)", APIAudio, b, "--b\r\n\r\nno headers\r\n--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--", "part 1: it has no Content-Disposition"},
		{"Content-Disposition not form-data", APIAudio, b, "--b\r\nContent-Disposition: attachment; name=model\r\n\r\nm\r\n--b--", `not form-data`},
		{"model is a file", APIAudio, b, "--b\r\nContent-Disposition: form-data; name=\"model\"; filename=\"m.txt\"\r\n\r\nm\r\n--b--", "is a file"},
		{"model too long", APIOther, b, "--b\r\nContent-Disposition: form-data; name=model\r\n\r\n" + strings.Repeat("m", MaxFormModelBytes+1) + "\r\n--b--", "over 4096"},
		{"model not UTF-8", APIAudio, b, "--b\r\nContent-Disposition: form-data; name=model\r\n\r\n\xff\xfe\r\n--b--", "not UTF-8"},
		{"a model part after a large file, the body cut", APIAudio, b,
			"--b\r\nContent-Disposition: form-data; name=file; filename=a.wav\r\n\r\n" + strings.Repeat("\x00\x01", 1<<20) + "\r\n--b\r\nContent-Disposition: form-data; name=model\r\n\r\nwhisper", "part 2 is not closed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rt.ParsePoolBody(tt.api, tt.ct, []byte(tt.body))
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want ErrBadRequest with %q", err, tt.want)
			}
		})
	}
	// Over the runtime's body bound.
	small := &Runtime{cpt: 4, maxBody: 10}
	if _, err := small.ParsePoolBody(APIAudio, goodCT, good); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "exceeds 10 bytes") {
		t.Errorf("over the bound: %v", err)
	}
}

// TestParseFormLinear: bodies built to make a multipart reader work hard
// are read, and read right: 4 MiB of near-delimiters (the boundary's text
// followed by neither CRLF nor "--"), 100,000 parts before the model, a
// 16 MiB file part of CRs and dashes before it. A reading quadratic in
// the body would not finish within the test's timeout.
func TestParseFormLinear(t *testing.T) {
	const bd = "abcdefghijklmnopqrstuvwxyz0123456789"
	head := func(name string) string {
		return "\r\n--" + bd + "\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n"
	}
	near := strings.Repeat("\r\n--"+bd+"x", (4<<20)/(len(bd)+5))
	var many strings.Builder
	for i := 0; i < 100000; i++ {
		many.WriteString(head("f"))
		many.WriteString("v")
	}
	crs := strings.Repeat("\r\r\n-\r\n--", (16<<20)/8)
	for _, tt := range []struct{ name, body string }{
		{"near-delimiters", head("file") + near + head("model") + "m" + "\r\n--" + bd + "--"},
		{"100000 parts", many.String() + head("model") + "m" + "\r\n--" + bd + "--"},
		{"16 MiB of CRs and dashes", head("file") + crs + head("model") + "m" + "\r\n--" + bd + "--"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseForm([]byte(tt.body), bd, 4)
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != "m" || got.Tokens != (len(tt.body)+3)/4 {
				t.Errorf("parseForm = model %q, %d tokens; want m, %d", got.Model, got.Tokens, (len(tt.body)+3)/4)
			}
		})
	}
}

// FuzzParseForm: any body is read without a panic, an error is
// ErrBadRequest, and a model read is the one Go's mime/multipart reads
// last for a body it reads whole.
func FuzzParseForm(f *testing.F) {
	for _, s := range []string{
		"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--",
		"x\r\n--b \r\n\r\n\r\n--b\r\nContent-Disposition: form-data; name=model\r\n\r\n\r\n--b--\r\n",
		"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n\r\n--bb\r\n--b--",
		"--b--", "--b", "\r\n--b\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parseForm(body, "b", 4)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		if got.Tokens < 1 || got.Tokens > len(body)/4+1 {
			t.Fatalf("tokens %d of a %d-byte body", got.Tokens, len(body))
		}
		r := multipart.NewReader(bytes.NewReader(body), "b")
		want := ""
		for {
			p, err := r.NextRawPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				return // Go's reader refuses what ours reads: no comparison
			}
			v, err := io.ReadAll(p)
			if err != nil {
				return
			}
			if p.FormName() == "model" {
				want = string(v)
			}
		}
		if got.Model != want {
			t.Fatalf("model %q, mime/multipart reads %q", got.Model, want)
		}
	})
}
