package mockworker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// FaultKind is how a generation fails on command (see Fault).
type FaultKind string

// The fault kinds.
const (
	// FaultReset cuts the connection with a TCP RST (SO_LINGER 0).
	FaultReset FaultKind = "reset"
	// FaultClose closes the connection cleanly (FIN) without the stream's
	// end. A response answered under a close fault is framed by the
	// connection's close from its first byte (HTTP/1.1, Connection:
	// close, no Content-Length, no chunked encoding), so the cut reads,
	// at the HTTP layer, as a normal end of body.
	FaultClose FaultKind = "close"
	// FaultStall sends nothing more; the connection stays open until the
	// client leaves or the server is closed.
	FaultStall FaultKind = "stall"
	// FaultError ends the answer with vLLM's error: in a stream the event
	// StreamErrorEvent then "data: [DONE]" (a 200 already sent), a
	// whole answer a 500 in vLLM's error shape.
	FaultError FaultKind = "error"
	// FaultExit ends the process at once (Config.Exit, os.Exit(1) by
	// default), as a crash.
	FaultExit FaultKind = "exit"
)

// StreamErrorEvent is the SSE event vLLM sends when a generation fails
// after its stream started, followed by "data: [DONE]\n\n":
// create_streaming_error_response / _convert_generation_error_to_streaming_response
// (vllm/entrypoints/openai/chat_completion/serving.py@006c49d4,
// completion/serving.py@030ea52e) serialize ErrorResponse with Python's
// json.dumps, hence the spaces after ':' and ','; a GenerationError
// (finish_reason "error", what vLLM's drain timeout gives the requests
// it aborts) is "Internal server error", InternalServerError, 500.
const StreamErrorEvent = `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"

// FaultHeader is the request header that sets a request's fault:
// "KIND@N" (ParseFault).
const FaultHeader = "X-Mock-Fault"

// maxFaultTokens bounds Fault.AfterTokens.
const maxFaultTokens = 1 << 30

// Fault makes generations fail after AfterTokens generated tokens: a
// streamed answer once it has sent that many tokens (0: before the
// first, and before the headers, which go out with it), a whole answer
// once the engine has produced that many (before its body). An answer of
// AfterTokens tokens or fewer ends normally. Set per request with
// FaultHeader or for every generation, in flight and to come, with
// Server.SetFault (POST /mock/fault). Only chat and completions
// generations fail; /v1/responses and /v1/messages do not.
type Fault struct {
	Kind        FaultKind `json:"kind"`
	AfterTokens int       `json:"after_tokens"`
}

// ParseFault reads "KIND@N" (N a whole number from 0 to 2^30); the
// error names what is wrong.
func ParseFault(s string) (Fault, error) {
	kind, n, ok := strings.Cut(s, "@")
	if !ok {
		return Fault{}, fmt.Errorf("fault %q: want KIND@N", s)
	}
	f := Fault{Kind: FaultKind(kind)}
	var err error
	if f.AfterTokens, err = strconv.Atoi(n); err != nil {
		return Fault{}, fmt.Errorf("fault %q: N is not a whole number", s)
	}
	return f, f.validate()
}

func (f Fault) validate() error {
	switch f.Kind {
	case FaultReset, FaultClose, FaultStall, FaultError, FaultExit:
	default:
		return fmt.Errorf("fault kind %q: want reset, close, stall, error or exit", f.Kind)
	}
	if f.AfterTokens < 0 || f.AfterTokens > maxFaultTokens {
		return fmt.Errorf("fault after %d tokens: want 0 to %d", f.AfterTokens, maxFaultTokens)
	}
	return nil
}

// SetFault makes every generation, in flight and to come, fail as f;
// nil clears it. A close fault frames as FaultClose says the answers
// that start after it; an answer already streamed chunked is closed
// without its terminating chunk (an unexpected EOF to its client).
func (s *Server) SetFault(f *Fault) {
	if f != nil {
		c := *f
		f = &c
	}
	s.fault.Store(f)
}

// handleFault serves /mock/fault: POST {"kind", "after_tokens"} sets the
// process-wide fault (answered with it), DELETE clears it (204), GET
// answers it (null for none); other methods 405.
func (s *Server) handleFault(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		var f Fault
		if aerr := decodeBody(body, &f); aerr != nil {
			writeError(w, aerr)
			return
		}
		if err := f.validate(); err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		s.SetFault(&f)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(f)
	case http.MethodDelete:
		s.SetFault(nil)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet, http.MethodHead:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.fault.Load())
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", msg: "/mock/fault takes GET, POST or DELETE"})
	}
}

// requestFault reads a request's FaultHeader (nil when absent).
func requestFault(r *http.Request) (*Fault, *apiError) {
	v := r.Header.Get(FaultHeader)
	if v == "" {
		return nil, nil
	}
	f, err := ParseFault(v)
	if err != nil {
		return nil, badRequest("%s: %v", FaultHeader, err)
	}
	return &f, nil
}

// faultNow is the fault to fire once sent tokens have gone out (or been
// produced): the request's, else the process-wide one, when it comes
// after at most sent tokens and before the answer's end.
func (g *generation) faultNow(sent int) *Fault {
	for _, f := range []*Fault{g.fault, g.s.fault.Load()} {
		if f != nil && sent >= f.AfterTokens && f.AfterTokens < g.sr.OutputLength {
			return f
		}
	}
	return nil
}

// closeFraming reports whether the answer, about to send its first byte,
// must be framed by the connection's close: it is under a close fault
// (whether or not the fault comes before its end).
func (g *generation) closeFraming() bool {
	for _, f := range []*Fault{g.fault, g.s.fault.Load()} {
		if f != nil && f.Kind == FaultClose {
			return true
		}
	}
	return false
}

// frameByClose takes the connection over before the answer's first
// byte, so that the answer is framed by the connection's close; g.w
// becomes the connection's writer. A connection that cannot be taken
// over (HTTP/2) keeps its framing.
func (g *generation) frameByClose(r *http.Request) {
	conn, rw, err := http.NewResponseController(g.w).Hijack()
	if err != nil {
		return
	}
	cw := &closeWriter{header: g.w.Header().Clone(), conn: conn, bw: rw.Writer, proto: r.ProtoAtLeast(1, 1)}
	gone := make(chan struct{})
	go func() {
		// The client's leaving ends the read (it sends nothing more on
		// a connection that will close).
		_, _ = rw.Reader.WriteTo(discard{})
		close(gone)
	}()
	g.w, g.conn, g.gone = cw, cw, gone
}

// discard is io.Discard as a plain Writer (Reader.WriteTo into
// io.Discard would use its ReaderFrom and read nothing new).
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// closeWriter is an http.ResponseWriter on a taken-over connection: the
// status line and headers with Connection: close and neither
// Content-Length nor Transfer-Encoding, then the body as written, ended
// by closing the connection.
type closeWriter struct {
	header http.Header
	conn   net.Conn
	bw     *bufio.Writer
	proto  bool // HTTP/1.1 (else 1.0)
	wrote  bool
}

func (c *closeWriter) Header() http.Header { return c.header }

func (c *closeWriter) WriteHeader(code int) {
	if c.wrote {
		return
	}
	c.wrote = true
	v := "HTTP/1.0"
	if c.proto {
		v = "HTTP/1.1"
	}
	fmt.Fprintf(c.bw, "%s %d %s\r\n", v, code, http.StatusText(code))
	h := c.header.Clone()
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	h.Set("Connection", "close")
	_ = h.Write(c.bw)
	_, _ = c.bw.WriteString("\r\n")
}

func (c *closeWriter) Write(b []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	return c.bw.Write(b)
}

// Flush sends what was written (http.Flusher).
func (c *closeWriter) Flush() { _ = c.bw.Flush() }

// close ends the answer: what was written, then FIN.
func (c *closeWriter) close() {
	_ = c.bw.Flush()
	_ = c.conn.Close()
}

// reset takes the connection over, when not done already, and cuts it
// with a TCP RST. On a connection it cannot take over (HTTP/2) it aborts
// the handler (the stream is reset).
func (g *generation) reset() {
	conn := net.Conn(nil)
	if g.conn != nil {
		_ = g.conn.bw.Flush()
		conn = g.conn.conn
	} else {
		c, _, err := http.NewResponseController(g.w).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		conn = c
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// fire makes the answer fail as f, buf holding the events not yet
// written (sent with what came before f). started: the headers went out.
func (g *generation) fire(r *http.Request, f *Fault, buf []byte, stream, started bool) {
	if len(buf) > 0 {
		_, _ = g.w.Write(buf)
		_ = http.NewResponseController(g.w).Flush()
	}
	switch f.Kind {
	case FaultReset:
		g.reset()
	case FaultClose:
		if !started && g.conn == nil {
			g.frameByClose(r)
		}
		switch {
		case g.conn != nil:
			if !started {
				// Cut before the first token (a whole answer: before its
				// body): the headers, then the end.
				if stream {
					g.streamHeaders(progress{})
				} else {
					g.conn.Header().Set("Content-Type", "application/json")
					g.conn.WriteHeader(http.StatusOK)
				}
			}
			g.conn.close()
		default:
			// Already chunked (or HTTP/2): close without the last chunk.
			c, _, err := http.NewResponseController(g.w).Hijack()
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			_ = c.Close()
		}
	case FaultStall:
		select {
		case <-r.Context().Done():
		case <-g.gone:
		case <-g.eng.done:
		}
	case FaultError:
		if !stream {
			writeError(g.w, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: "Internal server error"})
			return
		}
		if !started {
			g.streamHeaders(progress{})
		}
		_, _ = g.w.Write([]byte(StreamErrorEvent + "data: [DONE]\n\n"))
		_ = http.NewResponseController(g.w).Flush()
	case FaultExit:
		g.s.exit(1)
		// A hook that returns (tests): the connection dies with the
		// process it stands for.
		g.reset()
	}
}

// streamHeaders sends a streamed answer's headers (with p's simulated
// times when it has a token).
func (g *generation) streamHeaders(p progress) {
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	if len(p.times) > 0 {
		h.Set("x-mock-cached-tokens", strconv.Itoa(p.cached))
		h.Set("x-mock-ttft-seconds", seconds(p.times[0]-p.submitAt))
	}
	g.w.WriteHeader(http.StatusOK)
}

// Drain makes the engine leave as a vLLM shutting down gracefully
// does on SIGTERM with --shutdown-timeout (vllm-project/vllm PR 34730,
// re-applied as PR 36666; the /health 503 of PR 32420): from now on
// /health answers 503 and new requests (but GET requests and /mock/)
// get 503, while the requests in flight run to their end; Drained is
// closed once none is left. Idempotent. What ends the process (and cuts
// what is still running at a timeout: vLLM aborts those requests with
// finish_reason "error", StreamErrorEvent) is the caller's (`router
// mock-worker`, --drain-timeout).
func (s *Server) Drain() {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	if s.draining {
		return
	}
	s.draining = true
	close(s.drainStarted)
	if s.inFlight == 0 {
		close(s.drained)
	}
}

// Draining reports whether Drain was called.
func (s *Server) Draining() bool {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	return s.draining
}

// DrainStarted is closed when Drain is first called (by the process,
// or by POST /mock/drain).
func (s *Server) DrainStarted() <-chan struct{} { return s.drainStarted }

// Drained is closed once the server is draining and no request is in
// flight.
func (s *Server) Drained() <-chan struct{} { return s.drained }

// enter admits a request unless the server is draining.
func (s *Server) enter() bool {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	if s.draining {
		return false
	}
	s.inFlight++
	return true
}

// leave ends an admitted request.
func (s *Server) leave() {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	s.inFlight--
	if s.draining && s.inFlight == 0 {
		close(s.drained)
	}
}

// drainExempt: requests served while draining, not counted in flight:
// GET requests (health, metrics, models) and the mock's own /mock/.
func drainExempt(r *http.Request) bool {
	return r.Method == http.MethodGet || r.Method == http.MethodHead || strings.HasPrefix(r.URL.Path, "/mock/")
}

// handleHealth serves /health: 200, 503 while draining.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if s.Draining() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleDrain serves POST /mock/drain: Drain, answered 202
// {"draining": true}.
func (s *Server) handleDrain(w http.ResponseWriter, _ *http.Request) {
	s.Drain()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"draining":true}` + "\n"))
}

// errDraining is the answer to a request that arrives while draining.
var errDraining = errors.New("the engine is shutting down")

// WaitDrained waits for Drained or ctx; ctx's error when it ends first.
func (s *Server) WaitDrained(ctx context.Context) error {
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mockworker: draining: %w", ctx.Err())
	}
}
