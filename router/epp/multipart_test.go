package epp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/envoysim"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/epp"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/shared"
)

// formGateway is two engines behind the EPP (a RouterPicker over a live
// runtime, on a real gRPC listener) and the Envoy stand-in, in both body
// modes: w0 serves "whisper", w1 "llama". Each engine answers a POST
// under /v1/ other than the mock engine's own endpoints with what it got
// (formReply); the rest (metrics, models, health) is the mock engine's.
type formGateway struct {
	r    *router.Router
	urls map[envoysim.Mode]string
	mu   sync.Mutex
	got  int           // POSTs the engines echoed
	gate chan struct{} // when set, an echoed POST waits for it
}

// formReply is what a formGateway engine answers: its model, the path,
// Content-Type, the body's length and SHA-256, and the "model" form
// field as Go's multipart reader reads the body.
type formReply struct {
	Engine, Path, ContentType, SHA, Model string
	Length                                int
}

func newFormGateway(t *testing.T) *formGateway {
	t.Helper()
	g := &formGateway{}
	f := epp.NewFleet(t, epp.FleetOptions{
		Models:   []string{"whisper", "llama"},
		KVBlocks: 100000,
		Wrap: func(_, model string, m http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/") || strings.HasPrefix(r.URL.Path, "/v1/chat/") {
					m.ServeHTTP(w, r)
					return
				}
				body, _ := io.ReadAll(r.Body)
				g.mu.Lock()
				g.got++
				gate := g.gate
				g.mu.Unlock()
				if gate != nil {
					select {
					case <-gate:
					case <-r.Context().Done():
						return
					}
				}
				sum := sha256.Sum256(body)
				ans := formReply{Engine: model, Path: r.URL.RequestURI(), ContentType: r.Header.Get("Content-Type"), SHA: hex.EncodeToString(sum[:]), Length: len(body)}
				r.Body = io.NopCloser(bytes.NewReader(body))
				if r.ParseMultipartForm(1<<20) == nil {
					ans.Model = r.FormValue("model")
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(ans)
			})
		},
	})
	g.r = f.Router
	g.urls = serveGateway(t, f)
	return g
}

// sendForm posts body with Content-Type ct through the gateway at url;
// it returns the status, the engine that answered ("" when the EPP did)
// and the answer.
func sendForm(t *testing.T, ctx context.Context, url, ct string, body []byte) (int, string, []byte) {
	t.Helper()
	return send(t, ctx, http.MethodPost, url, ct, bytes.NewReader(body))
}

// TestGatewayMultipart: through the Envoy stand-in and the EPP, in both
// body modes, speech-to-text requests and a multipart pass-through reach
// the engine serving the form's "model" (whisper on one, llama on the
// other) with their path, Content-Type and body unchanged, the model part
// before or after a 2 MiB file; while one is held it is booked on its
// worker with the body's length at 4 characters a token (the runtime's
// default); malformed forms are the EPP's 400 (404 for a pass-through
// naming no model), no engine asked; the bookings return to 0.
func TestGatewayMultipart(t *testing.T) {
	g := newFormGateway(t)
	for _, mode := range []envoysim.Mode{envoysim.Buffered, envoysim.FullDuplex} {
		base := g.urls[mode]
		for _, tc := range []struct {
			path, model string
			size        int
			fields      []string
		}{
			{"/v1/audio/transcriptions", "whisper", 2 << 20, []string{"@file", "", "model", "whisper", "language", "en"}},
			{"/v1/audio/translations?x=1", "llama", 64 << 10, []string{"model", "llama", "@file", ""}},
			{"/v1/uploads/audio", "llama", 1 << 10, []string{"purpose", "x", "@file", "", "model", "llama"}},
		} {
			body, ct := testkit.SpeechForm(t, tc.size, tc.fields...)
			status, at, got := sendForm(t, t.Context(), base+tc.path, ct, body)
			var ans formReply
			if err := json.Unmarshal(got, &ans); err != nil || status != 200 || at == "" {
				t.Fatalf("%v: %s: %d from %q: %s", mode, tc.path, status, at, got)
			}
			sum := sha256.Sum256(body)
			if ans.Engine != tc.model || ans.Model != tc.model || ans.Path != tc.path || ans.ContentType != ct ||
				ans.Length != len(body) || ans.SHA != hex.EncodeToString(sum[:]) {
				t.Errorf("%v: %s: engine %s got %s, %q, %d bytes, model %q; want %s, %q, the %d bytes unchanged, model %q",
					mode, tc.path, ans.Engine, ans.Path, ans.ContentType, ans.Length, ans.Model, tc.path, ct, len(body), tc.model)
			}
		}
		g.settle(t)

		// Held: booked on whisper's worker with the body's size.
		g.mu.Lock()
		gate := make(chan struct{})
		g.gate = gate
		g.mu.Unlock()
		body, ct := testkit.SpeechForm(t, 256<<10, "@file", "", "model", "whisper")
		done := make(chan int, 1)
		go func() {
			status, _, _ := sendForm(t, context.Background(), base+"/v1/audio/transcriptions", ct, body)
			done <- status
		}()
		w := g.r.Workers("whisper", shared.RoleAggregated)[0]
		deadline := time.Now().Add(time.Minute)
		for w.ActiveRequests() != 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got, want := w.Load(false).ActivePrefillTokens, int64((len(body)+live.AudioBytesPerToken-1)/live.AudioBytesPerToken); w.ActiveRequests() != 1 || got != want {
			t.Errorf("%v: held transcription: %d booked, %d prefill tokens; want 1, %d (the %d-byte body at live.AudioBytesPerToken bytes a token)",
				mode, w.ActiveRequests(), got, want, len(body))
		}
		if n := g.r.Workers("llama", shared.RoleAggregated)[0].ActiveRequests(); n != 0 {
			t.Errorf("%v: %d booked on llama's worker", mode, n)
		}
		close(gate)
		if status := <-done; status != 200 {
			t.Errorf("%v: held transcription answered %d", mode, status)
		}
		g.mu.Lock()
		g.gate = nil
		g.mu.Unlock()
		g.settle(t)

		// Malformed: the EPP answers, no engine asked.
		good, goodCT := testkit.SpeechForm(t, 1<<10, "model", "whisper", "@file", "")
		noModel, noModelCT := testkit.SpeechForm(t, 1<<10, "language", "en", "@file", "")
		cut, cutCT := testkit.SpeechForm(t, 1<<20, "@file", "", "model", "whisper")
		cut = cut[:len(cut)-10]
		g.mu.Lock()
		before := g.got
		g.mu.Unlock()
		for _, tc := range []struct {
			name, path, ct string
			body           []byte
			status         int
			want           string
		}{
			{"no boundary", "/v1/audio/transcriptions", "multipart/form-data", good, 400, "has no boundary parameter"},
			{"no model part", "/v1/audio/transcriptions", noModelCT, noModel, 400, "you must provide a model parameter"},
			{"model part after a large file, cut", "/v1/audio/transcriptions", cutCT, cut, 400, "is not closed"},
			{"JSON to speech to text", "/v1/audio/translations", "application/json", []byte(`{"model":"whisper"}`), 400, "body is multipart/form-data"},
			{"pass-through naming no model", "/v1/uploads/audio", noModelCT, noModel, 404, "names no \\\"model\\\""},
		} {
			status, at, got := sendForm(t, t.Context(), base+tc.path, tc.ct, tc.body)
			if status != tc.status || at != "" || !bytes.Contains(got, []byte(tc.want)) || !bytes.Contains(got, []byte(`"invalid_request_error"`)) {
				t.Errorf("%v: %s: %d from %q: %s; want the EPP's %d invalid_request_error with %q", mode, tc.name, status, at, got, tc.status, tc.want)
			}
		}
		g.mu.Lock()
		after := g.got
		g.mu.Unlock()
		if after != before {
			t.Errorf("%v: the engines got %d malformed requests, want none", mode, after-before)
		}
		// The well-formed one goes through.
		if status, at, got := sendForm(t, t.Context(), base+"/v1/audio/transcriptions", goodCT, good); status != 200 || at == "" {
			t.Errorf("%v: good form: %d from %q: %s", mode, status, at, got)
		}
		g.settle(t)
	}
}

// settle waits until no worker has a booking.
func (g *formGateway) settle(t *testing.T) {
	t.Helper()
	settle(t, g.r, "whisper", "llama")
}
