package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/live"
)

// formEngine is an engine (httptest) that answers every POST with what
// it got: its name, the path, the Content-Type and the body's length and
// SHA-256, and the "model" form field as Go's own multipart reader reads
// it (so a body the router changed would show). With gate set it holds
// each request until gate closes.
type formEngine struct {
	*httptest.Server
	name string
	gate chan struct{}
	mu   sync.Mutex
	got  int
}

type formEcho struct {
	Worker, Path, ContentType, SHA, Model string
	Length                                int
}

func newFormEngine(t *testing.T, name string) *formEngine {
	t.Helper()
	e := &formEngine{name: name}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.got++
		gate := e.gate
		e.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		sum := sha256.Sum256(body)
		ans := formEcho{Worker: e.name, Path: r.URL.RequestURI(), ContentType: r.Header.Get("Content-Type"), SHA: hex.EncodeToString(sum[:]), Length: len(body)}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if err := r.ParseMultipartForm(1 << 20); err == nil {
			ans.Model = r.FormValue("model")
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ans)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *formEngine) requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got
}

// postForm posts body with Content-Type ct and returns the status and
// the answer.
func postForm(t *testing.T, ctx context.Context, url, ct string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// TestMultipartRoutedByFormModel: speech-to-text requests (and a
// multipart body to a path the router passes through) reach an engine
// serving the form's "model" with their path, Content-Type (boundary
// and all) and body unchanged, wherever the model part is: before the
// file (the OpenAI Python SDK's order), after a 4 MiB file (curl -F
// file=@... -F model=..., the Node SDK's order). While the engine holds
// one, it is booked on that worker with the body's length at 4
// characters a token; it ends booked nowhere.
func TestMultipartRoutedByFormModel(t *testing.T) {
	a, b := newFormEngine(t, "a"), newFormEngine(t, "b")
	e := newEnv(t, envOptions{}, backend{name: "a", url: a.URL, models: []string{"whisper"}}, backend{name: "b", url: b.URL, models: []string{"llama"}})
	for _, tt := range []struct {
		name, path, worker string
		size               int
		fields             []string
	}{
		{"transcription, model first", "/v1/audio/transcriptions", "a", 64 << 10, []string{"model", "whisper", "language", "en", "@file", ""}},
		{"transcription, model after a 4 MiB file", "/v1/audio/transcriptions?x=1", "a", 4 << 20, []string{"@file", "", "model", "whisper", "response_format", "json"}},
		{"translation", "/v1/audio/translations", "b", 1 << 10, []string{"@file", "", "model", "llama"}},
		{"pass-through of an unknown path", "/v1/uploads/audio", "b", 1 << 10, []string{"purpose", "x", "model", "llama", "@file", ""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body, ct := testkit.SpeechForm(t, tt.size, tt.fields...)
			status, got, hdr := postForm(t, context.Background(), e.url+tt.path, ct, body)
			var ans formEcho
			if err := json.Unmarshal(got, &ans); err != nil || status != 200 {
				t.Fatalf("status %d: %s", status, got)
			}
			sum := sha256.Sum256(body)
			if ans.Worker != tt.worker || hdr.Get("X-Switchyard-Worker") != tt.worker {
				t.Errorf("served by %s (header %q), want %s, the engine serving the form's model", ans.Worker, hdr.Get("X-Switchyard-Worker"), tt.worker)
			}
			if ans.Path != tt.path || ans.ContentType != ct || ans.Length != len(body) || ans.SHA != hex.EncodeToString(sum[:]) {
				t.Errorf("engine got %s, %q, %d bytes (sha %s); want %s, %q, %d bytes unchanged", ans.Path, ans.ContentType, ans.Length, ans.SHA, tt.path, ct, len(body))
			}
			if want := map[string]string{"a": "whisper", "b": "llama"}[tt.worker]; ans.Model != want {
				t.Errorf("engine read model %q from the body, want %q", ans.Model, want)
			}
		})
	}
	e.settle(t)
	// Booked while held: the body's length at live.AudioBytesPerToken bytes a token.
	gate := make(chan struct{})
	a.mu.Lock()
	a.gate = gate
	a.mu.Unlock()
	body, ct := testkit.SpeechForm(t, 100<<10, "@file", "", "model", "whisper")
	done := make(chan int, 1)
	go func() {
		status, _, _ := postForm(t, context.Background(), e.url+"/v1/audio/transcriptions", ct, body)
		done <- status
	}()
	testkit.Eventually(t, "booked", func() bool { return e.workers[0].ActiveRequests() == 1 })
	if got, want := e.workers[0].Load(false).ActivePrefillTokens, int64((len(body)+live.AudioBytesPerToken-1)/live.AudioBytesPerToken); got != want {
		t.Errorf("prefill tokens booked = %d, want %d (the %d-byte body at live.AudioBytesPerToken bytes a token)", got, want, len(body))
	}
	if n := e.workers[1].ActiveRequests(); n != 0 {
		t.Errorf("%d requests booked on the worker not serving whisper", n)
	}
	close(gate)
	if status := <-done; status != 200 {
		t.Errorf("held transcription: status %d", status)
	}
	e.settle(t)
	testkit.Eventually(t, "unbooked", func() bool { return e.workers[0].ActiveRequests() == 0 })
	if got := e.metric(t, "switchyard_requests_total", "model", "whisper", "code", "200"); got != 3 {
		t.Errorf("requests_total{model=whisper,code=200} = %v, want 3", got)
	}
}

// TestMultipartErrors: malformed speech-to-text and pass-through bodies
// are answered 400 (404 for a pass-through naming no model, as for a
// JSON one) in OpenAI's error shape, naming what is wrong, and reach no
// engine.
func TestMultipartErrors(t *testing.T) {
	a := newFormEngine(t, "a")
	e := newEnv(t, envOptions{}, backend{name: "a", url: a.URL, models: []string{"whisper"}})
	good, goodCT := testkit.SpeechForm(t, 1<<10, "model", "whisper", "@file", "")
	noModel, noModelCT := testkit.SpeechForm(t, 1<<10, "language", "en", "@file", "")
	bd := goodCT[strings.Index(goodCT, "boundary=")+len("boundary="):]
	cut, cutCT := testkit.SpeechForm(t, 2<<20, "@file", "", "model", "whisper")
	cut = cut[:len(cut)-len(bd)-8] // the closing delimiter and the model part's end lost
	for _, tt := range []struct {
		name, path, ct string
		body           []byte
		status         int
		want           string
	}{
		{"no boundary", "/v1/audio/transcriptions", "multipart/form-data", good, 400, "has no boundary parameter"},
		{"no model part", "/v1/audio/transcriptions", noModelCT, noModel, 400, "you must provide a model parameter"},
		{"a model part after a large file, the body cut", "/v1/audio/translations", cutCT, cut, 400, "is not closed"},
		{"wrong boundary", "/v1/audio/transcriptions", "multipart/form-data; boundary=nope", good, 400, "no delimiter line"},
		{"JSON to speech to text", "/v1/audio/transcriptions", "application/json", []byte(`{"model":"whisper","file":"x"}`), 400, "body is multipart/form-data"},
		{"pass-through naming no model", "/v1/uploads/audio", noModelCT, noModel, 404, "the body names none"},
		{"pass-through without a boundary", "/v1/uploads/audio", "multipart/form-data", good, 400, "has no boundary parameter"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, got, _ := postForm(t, context.Background(), e.url+tt.path, tt.ct, tt.body)
			var ans struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal(got, &ans); err != nil {
				t.Fatalf("answer %s: %v", got, err)
			}
			if status != tt.status || ans.Error.Type != "invalid_request_error" || !strings.Contains(ans.Error.Message, tt.want) {
				t.Errorf("status %d, error %+v; want %d invalid_request_error with %q", status, ans.Error, tt.status, tt.want)
			}
		})
	}
	if n := a.requests(); n != 0 {
		t.Errorf("the engine got %d requests, want none", n)
	}
	// The good body does go through.
	if status, got, _ := postForm(t, context.Background(), e.url+"/v1/audio/transcriptions", goodCT, good); status != 200 {
		t.Errorf("good form: %d %s", status, got)
	}
	e.settle(t)
	if got := e.metric(t, "switchyard_requests_total", "model", "whisper", "code", "200"); got != 1 {
		t.Errorf("requests_total{model=whisper,code=200} = %v, want 1", got)
	}
}
