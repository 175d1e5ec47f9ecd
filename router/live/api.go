package live

import "strings"

// API is the request schema an endpoint takes: which fields carry a
// generation request's prompt, or a pooling request's input.
type API uint8

// The request schemas.
const (
	// APICompletions is OpenAI's completions schema: "prompt" (text, or
	// token ids), "prompt_token_ids".
	APICompletions API = iota
	// APIChat is OpenAI's chat completions schema: "messages".
	APIChat
	// APIResponses is OpenAI's Responses schema: "input" (a string or a
	// list of items) and "instructions".
	APIResponses
	// APIMessages is Anthropic's Messages schema: "messages" (content a
	// string or a list of blocks) and "system".
	APIMessages
	// APIPool is the pooling and scoring schemas (embeddings, pooling,
	// classify, score, rerank): a model and inputs, no prompt to key.
	APIPool
	// APIUtility is the engine utilities' schemas (tokenize,
	// detokenize): a model, and no load.
	APIUtility
	// APIOther is a path the router does not know (pass-through): the
	// body's "model", when it names one, chooses the engines.
	APIOther
	// APIAudio is OpenAI's speech-to-text schemas (createTranscription,
	// createTranslation), which vLLM serves
	// (vllm/entrypoints/openai/speech_to_text/api_router.py: a
	// TranscriptionRequest or TranslationRequest read as Form()): a
	// multipart/form-data body of the audio "file" and form fields, its
	// "model" among them; routed by load like APIPool, no prompt to key
	// (ParsePoolBody).
	APIAudio
)

// String names the schema as metrics and logs label it.
func (a API) String() string {
	switch a {
	case APICompletions:
		return "completions"
	case APIChat:
		return "chat"
	case APIResponses:
		return "responses"
	case APIMessages:
		return "messages"
	case APIPool:
		return "pool"
	case APIUtility:
		return "utility"
	case APIAudio:
		return "audio"
	default:
		return "other"
	}
}

// Generates reports whether requests of schema a generate from a prompt
// (completions, chat, Responses, Messages): they are keyed by their
// prompt, booked as load until their answer ends, and metered.
func (a API) Generates() bool { return a <= APIMessages }

// Endpoint is one POST endpoint of an engine's OpenAI-compatible server
// that the router routes: its path and the schema of its body.
type Endpoint struct {
	// Path is the endpoint's path, e.g. "/v1/chat/completions".
	Path string
	// API is its body's schema.
	API API
}

// endpoints are the POST endpoints of vLLM's OpenAI-compatible server
// (vllm/entrypoints/openai/api_server.py and the routers it mounts) and
// SGLang's (python/sglang/srt/entrypoints/http_server.py) that take a
// model and are routed to an engine serving it.
var endpoints = []Endpoint{
	{"/v1/completions", APICompletions},
	{"/v1/chat/completions", APIChat},
	{"/v1/responses", APIResponses},
	{"/v1/messages", APIMessages},
	{"/v1/embeddings", APIPool},
	{"/pooling", APIPool},
	{"/classify", APIPool},
	{"/v1/classify", APIPool},
	{"/score", APIPool},
	{"/v1/score", APIPool},
	{"/rerank", APIPool},
	{"/v1/rerank", APIPool},
	{"/v2/rerank", APIPool},
	// Speech to text: multipart/form-data bodies (APIAudio).
	{"/v1/audio/transcriptions", APIAudio},
	{"/v1/audio/translations", APIAudio},
	{"/tokenize", APIUtility},
	{"/detokenize", APIUtility},
	{"/v1/tokenize", APIUtility},
	{"/v1/detokenize", APIUtility},
	// Anthropic's token count, which Anthropic clients (Claude Code among
	// them) call before their requests: an engine that does not serve it
	// answers its own 404, as it would without the router.
	{"/v1/messages/count_tokens", APIUtility},
}

// Endpoints returns the POST endpoints the router routes by their
// schema, in a fixed order; a copy.
func Endpoints() []Endpoint { return append([]Endpoint(nil), endpoints...) }

// EndpointFor returns the endpoint of path (a query is ignored); false
// when the router does not know it.
func EndpointFor(path string) (Endpoint, bool) {
	path, _, _ = strings.Cut(path, "?")
	for _, e := range endpoints {
		if e.Path == path {
			return e, true
		}
	}
	return Endpoint{}, false
}
