package mockworker

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
)

// tokenizePrompt is the server's /tokenize count of a text prompt.
func tokenizePrompt(t *testing.T, url, p string) int {
	t.Helper()
	resp, body := post(t, url+"/tokenize", map[string]any{"model": testModel, "prompt": p})
	var a tokenizeAnswer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("/tokenize: %d %s", resp.StatusCode, body)
	}
	return a.Count
}

type embeddingAnswer struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage map[string]any `json:"usage"`
}

// TestEmbeddings: vLLM's EmbeddingResponse for a list of strings, token
// ids and base64; usage the inputs' tokens; equal inputs embed equally.
func TestEmbeddings(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	resp, body := post(t, url+"/v1/embeddings", map[string]any{"model": testModel, "input": []string{"one text", "another text", "one text"}})
	var a embeddingAnswer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	want := 2*tokenizePrompt(t, url, "one text") + tokenizePrompt(t, url, "another text")
	if !strings.HasPrefix(a.ID, "embd-") || a.Object != "list" || a.Model != testModel || len(a.Data) != 3 ||
		a.Usage["prompt_tokens"] != float64(want) || a.Usage["total_tokens"] != float64(want) {
		t.Fatalf("answer %s, want %d tokens", body, want)
	}
	vecs := make([][]float64, 3)
	for i, d := range a.Data {
		if d.Index != i || d.Object != "embedding" || json.Unmarshal(d.Embedding, &vecs[i]) != nil || len(vecs[i]) != EmbeddingDim {
			t.Fatalf("data[%d] %+v", i, d)
		}
		var n float64
		for _, x := range vecs[i] {
			n += x * x
		}
		if math.Abs(n-1) > 1e-9 {
			t.Fatalf("data[%d] norm² %v", i, n)
		}
	}
	if string(a.Data[0].Embedding) != string(a.Data[2].Embedding) || string(a.Data[0].Embedding) == string(a.Data[1].Embedding) {
		t.Fatalf("embeddings %s", body)
	}

	resp, body = post(t, url+"/v1/embeddings", map[string]any{"model": testModel, "input": "one text", "encoding_format": "base64"})
	var b embeddingAnswer
	var s string
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &b) != nil || json.Unmarshal(b.Data[0].Embedding, &s) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 4*EmbeddingDim {
		t.Fatalf("base64 %q: %v", s, err)
	}
	for j := range EmbeddingDim {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); got != float32(vecs[0][j]) {
			t.Fatalf("component %d: %v, want %v", j, got, float32(vecs[0][j]))
		}
	}

	resp, body = post(t, url+"/v1/embeddings", map[string]any{"model": testModel, "input": [][]int{{1, 2, 3}, {4, 5}}})
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &b) != nil || len(b.Data) != 2 || b.Usage["prompt_tokens"] != float64(5) {
		t.Fatalf("token ids: %d %s", resp.StatusCode, body)
	}

	for _, bad := range []string{`{"model": "test-model"}`, `{"model": "test-model", "input": {}}`,
		`{"model": "test-model", "input": "x", "dimensions": 3}`, `{"model": "test-model", "input": "x", "encoding_format": "hex"}`,
		`{"model": "test-model", "input": []}`} {
		resp, body := postRaw(t, url+"/v1/embeddings", []byte(bad))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":400`) {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, body)
		}
	}
}

// TestScoreRerankClassify: score pairs 1:N, an identical pair scores 1;
// rerank sorts by relevance and keeps top_n; classify's probs sum to 1.
func TestScoreRerankClassify(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	resp, body := post(t, url+"/v1/score", map[string]any{"model": testModel, "text_1": "the query",
		"text_2": []string{"the query", "something else"}})
	var sc struct {
		Object string `json:"object"`
		Data   []struct {
			Index  int     `json:"index"`
			Object string  `json:"object"`
			Score  float64 `json:"score"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &sc) != nil || len(sc.Data) != 2 || sc.Data[1].Index != 1 ||
		sc.Data[0].Object != "score" || math.Abs(sc.Data[0].Score-1) > 1e-9 || sc.Data[1].Score >= 1 || sc.Data[1].Score < 0 {
		t.Fatalf("score %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/score", map[string]any{"model": testModel, "text_1": []string{"a", "b"}, "text_2": []string{"a", "b", "c"}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("2:3 score: %d %s", resp.StatusCode, body)
	}

	docs := []string{"d zero", "the query", "d two"}
	resp, body = post(t, url+"/v2/rerank", map[string]any{"model": testModel, "query": "the query", "documents": docs, "top_n": 2})
	var rr struct {
		ID      string         `json:"id"`
		Usage   map[string]int `json:"usage"`
		Results []struct {
			Index    int `json:"index"`
			Document struct {
				Text string `json:"text"`
			} `json:"document"`
			RelevanceScore float64 `json:"relevance_score"`
		} `json:"results"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &rr) != nil || !strings.HasPrefix(rr.ID, "rerank-") ||
		len(rr.Results) != 2 || rr.Results[0].Index != 1 || rr.Results[0].Document.Text != "the query" ||
		rr.Results[0].RelevanceScore < rr.Results[1].RelevanceScore || rr.Usage["prompt_tokens"] == 0 {
		t.Fatalf("rerank %d %s", resp.StatusCode, body)
	}

	resp, body = post(t, url+"/classify", map[string]any{"model": testModel, "input": []string{"x", "y"}})
	var cl struct {
		Data []struct {
			Label      string    `json:"label"`
			Probs      []float64 `json:"probs"`
			NumClasses int       `json:"num_classes"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &cl) != nil || len(cl.Data) != 2 {
		t.Fatalf("classify %d %s", resp.StatusCode, body)
	}
	for _, d := range cl.Data {
		if d.NumClasses != 2 || len(d.Probs) != 2 || math.Abs(d.Probs[0]+d.Probs[1]-1) > 1e-9 ||
			(d.Label != "LABEL_0" && d.Label != "LABEL_1") {
			t.Fatalf("classify %s", body)
		}
	}

	// SGLang serves /v1/classify but not /score, /v2/rerank or /pooling.
	surl := tokenizerServer(t, EngineSGLang)
	if resp, body := post(t, surl+"/v1/classify", map[string]any{"model": testModel, "input": "x"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("SGLang /v1/classify: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"/score", "/v2/rerank", "/pooling"} {
		if resp, body := post(t, surl+p, map[string]any{"model": testModel, "input": "x"}); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("SGLang %s: %d %s", p, resp.StatusCode, body)
		}
	}
}

// TestDetokenize: /detokenize inverts /tokenize of a prompt (vLLM's
// shape); ids outside the vocabulary are a 400.
func TestDetokenize(t *testing.T) {
	url := tokenizerServer(t, EngineVLLM)
	resp, body := post(t, url+"/tokenize", map[string]any{"model": testModel, "prompt": "hello world, again"})
	var a tokenizeAnswer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/detokenize", map[string]any{"model": testModel, "tokens": a.Tokens})
	var d struct {
		Prompt string `json:"prompt"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &d) != nil || !strings.HasSuffix(d.Prompt, "hello world, again") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, url+"/detokenize", map[string]any{"model": testModel, "tokens": []int64{-1}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad id: %d %s", resp.StatusCode, body)
	}
}
