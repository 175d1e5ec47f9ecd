package live

import (
	"bytes"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"
)

// MaxFormModelBytes bounds the value of a multipart/form-data body's
// "model" part (ParsePoolBody): a model name is an id of a few dozen
// bytes, so a longer one is refused rather than copied.
const MaxFormModelBytes = 4 << 10

// maxBoundaryBytes is the longest multipart boundary RFC 2046 (section
// 5.1.1) allows.
const maxBoundaryBytes = 70

// ParsePoolBody is ParsePool for a body sent with the Content-Type
// contentType to an endpoint of schema api (APIPool, APIOther, APIAudio):
//
//   - a multipart/form-data body (RFC 7578) sent to a speech-to-text
//     endpoint (APIAudio) or passed through (APIOther), as OpenAI's SDKs
//     and curl -F send /v1/audio/transcriptions and
//     /v1/audio/translations, is read as a form (parseForm): its "model"
//     is the value of its last part named "model" (a field given twice
//     counts with its last value, as Starlette's FormData, which vLLM's
//     FastAPI server reads, takes it; an empty value names no model, as
//     FastAPI reads an empty form field as absent), and its size is the
//     body's length at AudioBytesPerToken bytes a token for a
//     speech-to-text body, at the runtime's characters per token for a
//     pass-through form, rounded up (the audio is not decoded);
//   - a speech-to-text body (APIAudio) of any other content type is
//     refused: vLLM reads those endpoints' bodies as forms only
//     (vllm/entrypoints/openai/speech_to_text/api_router.py, commit
//     029329a8, Annotated[TranscriptionRequest, Form()], whose "file" is
//     an UploadFile);
//   - any other body is JSON, read by ParsePool.
//
// The body is not changed; the face forwards it and its Content-Type
// as they came. Time is linear in len(body); nothing of the body is
// copied but the model's value (at most MaxFormModelBytes).
//
// Errors wrap ErrBadRequest: ParsePool's, a multipart Content-Type that
// is malformed or has no boundary (or one RFC 2046 does not allow), a
// multipart body that is malformed (no delimiter line of its
// boundary, a part whose headers do not end, a body cut before its
// closing delimiter), a "model" part that is a file, over
// MaxFormModelBytes or not UTF-8, and a speech-to-text body that is not
// multipart/form-data.
func (rt *Runtime) ParsePoolBody(api API, contentType string, body []byte) (PoolRequest, error) {
	if int64(len(body)) > rt.maxBody {
		return PoolRequest{}, fmt.Errorf("%w: request body of %d bytes exceeds %d bytes", ErrBadRequest, len(body), rt.maxBody)
	}
	if api == APIAudio || api == APIOther {
		form, boundary, err := formBoundary(contentType)
		if err != nil {
			return PoolRequest{}, err
		}
		if form {
			req, err := parseForm(body, boundary, rt.cpt)
			if err == nil && api == APIAudio {
				req.Tokens = max((len(body)+AudioBytesPerToken-1)/AudioBytesPerToken, 1)
			}
			return req, err
		}
		if api == APIAudio {
			ct := contentType
			if ct == "" {
				ct = "no Content-Type"
			}
			return PoolRequest{}, fmt.Errorf("%w: a speech-to-text request's body is multipart/form-data (the audio \"file\" and the fields, \"model\" among them), not %q",
				ErrBadRequest, ct)
		}
	}
	return parsePool(body, rt.cpt)
}

// formBoundary reads a Content-Type: whether it is multipart/form-data
// and, when it is, its boundary. A Content-Type of another media type, or
// one that does not parse as a media type at all, is not a form (false,
// no error: the body is then read as JSON, as the engines read it).
// Errors wrap ErrBadRequest: a multipart/form-data type whose parameters
// do not parse, or whose boundary is missing, empty or over 70 bytes.
func formBoundary(contentType string) (form bool, boundary string, err error) {
	media, _, _ := strings.Cut(contentType, ";")
	if !strings.EqualFold(strings.TrimSpace(media), "multipart/form-data") {
		return false, "", nil
	}
	_, params, perr := mime.ParseMediaType(contentType)
	if perr != nil {
		return true, "", fmt.Errorf("%w: the Content-Type %q does not parse: %v", ErrBadRequest, clip(contentType), perr)
	}
	boundary = params["boundary"]
	switch {
	case boundary == "":
		return true, "", fmt.Errorf("%w: the multipart/form-data Content-Type has no boundary parameter, so its parts cannot be found", ErrBadRequest)
	case !validBoundary(boundary):
		return true, "", fmt.Errorf("%w: the multipart boundary %q is not one RFC 2046 allows (1 to %d digits, letters or '()+_,-./:=? and spaces, not ending with a space)",
			ErrBadRequest, clip(boundary), maxBoundaryBytes)
	}
	return true, boundary, nil
}

// clip cuts s for an error message at 128 bytes.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// AudioBytesPerToken is the bytes of a speech-to-text request's body
// booked as one prefill token: 640, the bytes of 16 kHz 16-bit mono PCM
// (32,000 bytes a second, the rate Whisper-family models resample to) in
// the 20 ms each of Whisper's encoder positions covers (1,500 positions a
// 30 s window: Radford et al., "Robust Speech Recognition via
// Large-Scale Weak Supervision", 2022, section 2.2). The audio is not
// decoded, so a compressed file (MP3, Opus) is booked as fewer seconds
// than it holds; at characters per token (4 bytes) a 1 MB file would be
// booked as 262,144 tokens, past many engines' whole KV cache, where it
// costs its engine a few thousand positions.
const AudioBytesPerToken = 640

var (
	crlf     = []byte("\r\n")
	crlfCRLF = []byte("\r\n\r\n")
	dashes   = []byte("--")
)

// parseForm reads a multipart/form-data body (RFC 2046 section 5.1.1,
// RFC 7578) with boundary: its last part named "model" (its
// Content-Disposition's name parameter) gives PoolRequest.Model; the
// body's length at cpt characters per token, rounded up (at least 1),
// gives PoolRequest.Tokens.
//
// The body is scanned in place, once: each delimiter (CRLF "--" boundary,
// or "--" boundary at the body's start) is searched for from the end of
// the one before, and a part's headers are read up to the empty line
// that ends them, so the work is linear in len(body) wherever the
// "model" part is, before or after a file part of any size, and no part
// is copied but the model's value. The boundary followed by anything but
// "--" (the closing delimiter) or optional spaces and CRLF is part of the
// data, as Go's mime/multipart and python-multipart read it. A preamble
// before the first delimiter and an epilogue after the closing one are
// ignored, as RFC 2046 says. Errors: see ParsePoolBody.
func parseForm(body []byte, boundary string, cpt int) (PoolRequest, error) {
	if cpt < 1 {
		cpt = DefaultCharsPerToken
	}
	delim := []byte("\r\n--" + boundary)
	after, closing, ok := 0, false, false
	if dash := delim[len(crlf):]; bytes.HasPrefix(body, dash) {
		after, closing, ok = delimEnd(body, len(dash))
	}
	if !ok {
		if _, after, closing, ok = nextDelim(body, delim, 0); !ok {
			return PoolRequest{}, fmt.Errorf("%w: the multipart body has no delimiter line of its Content-Type's boundary %q", ErrBadRequest, boundary)
		}
	}
	var (
		model    []byte
		hasModel bool
	)
	for part := 1; !closing; part++ {
		start, next, last, ok := nextDelim(body, delim, after)
		if !ok {
			return PoolRequest{}, fmt.Errorf("%w: multipart part %d is not closed: the body ends before the next delimiter of its boundary (a body cut short, or without its closing --%s--)",
				ErrBadRequest, part, boundary)
		}
		content := body[after:start]
		after, closing = next, last
		// The part's headers end at an empty line; a part without headers
		// starts with it.
		var header []byte
		if bytes.HasPrefix(content, crlf) {
			content = content[len(crlf):]
		} else {
			h := bytes.Index(content, crlfCRLF)
			if h < 0 {
				return PoolRequest{}, fmt.Errorf("%w: multipart part %d: its headers do not end with an empty line", ErrBadRequest, part)
			}
			header, content = content[:h], content[h+len(crlfCRLF):]
		}
		name, file, err := formName(header)
		if err != nil {
			return PoolRequest{}, fmt.Errorf("%w: multipart part %d: %w", ErrBadRequest, part, err)
		}
		if name != "model" {
			continue
		}
		switch {
		case file:
			return PoolRequest{}, fmt.Errorf("%w: the multipart \"model\" part is a file (it has a filename); it must be a form field", ErrBadRequest)
		case len(content) > MaxFormModelBytes:
			return PoolRequest{}, fmt.Errorf("%w: the multipart \"model\" part is %d bytes, over %d", ErrBadRequest, len(content), MaxFormModelBytes)
		case !utf8.Valid(content):
			return PoolRequest{}, fmt.Errorf("%w: the multipart \"model\" part is not UTF-8 text", ErrBadRequest)
		}
		model, hasModel = content, true
	}
	req := PoolRequest{Tokens: max((len(body)+cpt-1)/cpt, 1)}
	if hasModel {
		req.Model = string(model)
	}
	return req, nil
}

// delimEnd reads what follows a boundary's "--" boundary at body[i:]: "--"
// closes the body (closing); optional spaces and tabs (RFC 2046's
// transport padding) then CRLF open a part. after is the index past it;
// false when neither follows (the bytes are data, not a delimiter).
func delimEnd(body []byte, i int) (after int, closing, ok bool) {
	if bytes.HasPrefix(body[i:], dashes) {
		return i + len(dashes), true, true
	}
	for i < len(body) && (body[i] == ' ' || body[i] == '\t') {
		i++
	}
	if bytes.HasPrefix(body[i:], crlf) {
		return i + len(crlf), false, true
	}
	return 0, false, false
}

// nextDelim finds the first delimiter line in body[from:]: start is the
// index of its CRLF (where the part before it ends), after the index past
// the line (delimEnd). false when there is none. Linear in the bytes it
// passes: a match that is not a delimiter is skipped whole, which misses
// none, as delim (CRLF "--" and bchars, validBoundary) has no CR past its
// first byte and so cannot overlap itself.
func nextDelim(body, delim []byte, from int) (start, after int, closing, ok bool) {
	for {
		i := bytes.Index(body[from:], delim)
		if i < 0 {
			return 0, 0, false, false
		}
		start = from + i
		if after, closing, ok = delimEnd(body, start+len(delim)); ok {
			return start, after, closing, true
		}
		from = start + len(delim)
	}
}

// validBoundary reports whether b is a boundary RFC 2046 (section 5.1.1)
// allows: 1 to 70 of its bchars (digits, letters, '()+_,-./:=? and
// space), not ending with a space.
func validBoundary(b string) bool {
	if b == "" || len(b) > maxBoundaryBytes || b[len(b)-1] == ' ' {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || strings.IndexByte("'()+_,-./:=? ", c) >= 0) {
			return false
		}
	}
	return true
}

// formName reads a form part's header block (lines separated by CRLF,
// without the empty line that ends it): its Content-Disposition's name,
// and whether it has a filename (a file part). Header names are
// case-insensitive (RFC 7578 section 4.2 and RFC 2183). Errors: a part
// with no form-data Content-Disposition, or one that does not parse.
func formName(header []byte) (name string, file bool, err error) {
	var disp string
	found := false
	for len(header) > 0 {
		line := header
		if i := bytes.Index(header, crlf); i >= 0 {
			line, header = header[:i], header[i+len(crlf):]
		} else {
			header = nil
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(k)), "Content-Disposition") {
			disp, found = string(bytes.TrimSpace(v)), true
		}
	}
	if !found {
		return "", false, fmt.Errorf("it has no Content-Disposition header (RFC 7578 section 4.2)")
	}
	kind, params, perr := mime.ParseMediaType(disp)
	if perr != nil {
		return "", false, fmt.Errorf("its Content-Disposition %q does not parse: %w", clip(disp), perr)
	}
	if kind != "form-data" {
		return "", false, fmt.Errorf("its Content-Disposition is %q, not form-data", clip(kind))
	}
	// mime.ParseMediaType decodes an RFC 2231 filename* into filename.
	_, file = params["filename"]
	return params["name"], file, nil
}
