package testkit

import (
	"bytes"
	"mime/multipart"
	"testing"
)

// SpeechForm builds a speech-to-text request's multipart/form-data body
// as curl -F and the OpenAI SDKs send it: fields are name, value pairs in
// order, the name "@file" (its value ignored) a file part "file"
// ("a.wav") of size bytes of audio-like data, CRLFs and dashes among
// them, so that a reader cannot find a part's end by looking for them. It
// returns the body and its Content-Type (with the boundary). It fails t
// when the writer does.
func SpeechForm(t testing.TB, size int, fields ...string) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "@file" {
			pw, err := w.CreateFormFile("file", "a.wav")
			if err != nil {
				t.Fatal(err)
			}
			chunk := []byte("RIFF\x00\x01\r\n--\r\n")
			for n := 0; n < size; n += len(chunk) {
				_, _ = pw.Write(chunk[:min(len(chunk), size-n)])
			}
			continue
		}
		if err := w.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), w.FormDataContentType()
}
