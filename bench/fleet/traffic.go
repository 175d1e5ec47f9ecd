package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// blockTokens is the engines' KV block size, vLLM's default.
const blockTokens = 16

// conversation is one client's chat: a model (the base model or a LoRA
// adapter), a cache_salt or none, and turns sent one after the other,
// each follow-up's messages the previous ones, the previous answer and a
// new question.
type conversation struct {
	id    int
	model string // the base model or an adapter
	salt  string // "" for none
	turns int
	// repeats says, per turn, whether the same request is sent again
	// right after its answer (a repeat).
	repeats []bool
	system  string
	rng     *rand.Rand

	// The conversation so far: its messages, the next turn, and the last
	// turn's prompt tokens.
	msgs       []map[string]string
	next       int
	prevPrompt int
}

// kind names the conversation's share of the traffic: base, lora,
// salted, or lora+salted.
func (c *conversation) kind() string {
	switch {
	case c.model != baseModel && c.salt != "":
		return "lora+salted"
	case c.model != baseModel:
		return "lora"
	case c.salt != "":
		return "salted"
	}
	return "base"
}

// baseModel is the engines' served model; adapters are named by the
// --lora flag.
const baseModel = "mock"

// workload makes the conversations of one traffic phase.
type workload struct {
	adapters  []string
	loraShare float64
	saltShare float64
	// repeatShare is the chance that a turn of a LoRA or salted
	// conversation is sent again right after its answer.
	repeatShare float64
	minTurns    int
	maxTurns    int
	systems     []string
	salts       []string
}

func newWorkload(o options) *workload {
	w := &workload{adapters: o.adapters, loraShare: o.loraShare, saltShare: o.saltShare, repeatShare: o.repeatShare,
		minTurns: o.minTurns, maxTurns: o.maxTurns}
	for i := range 4 {
		w.systems = append(w.systems, fmt.Sprintf("System prompt %d. ", i)+
			strings.Repeat("You are a careful assistant who answers in full, plain sentences. ", 12))
	}
	for i := range 4 {
		w.salts = append(w.salts, fmt.Sprintf("tenant-%d-secret", i))
	}
	return w
}

// conversations returns n conversations numbered from first, drawn from
// seed.
func (w *workload) conversations(seed uint64, first, n int) []*conversation {
	out := make([]*conversation, n)
	for i := range out {
		id := first + i
		rng := rand.New(rand.NewPCG(seed, uint64(id)))
		c := &conversation{id: id, model: baseModel, rng: rng, system: w.systems[rng.IntN(len(w.systems))]}
		if len(w.adapters) > 0 && rng.Float64() < w.loraShare {
			c.model = w.adapters[rng.IntN(len(w.adapters))]
		}
		if rng.Float64() < w.saltShare {
			c.salt = w.salts[rng.IntN(len(w.salts))]
		}
		c.turns = w.minTurns + rng.IntN(w.maxTurns-w.minTurns+1)
		c.repeats = make([]bool, c.turns)
		for t := range c.repeats {
			c.repeats[t] = c.kind() != "base" && rng.Float64() < w.repeatShare
		}
		out[i] = c
	}
	return out
}

// answer is what the bench reads of a chat completion.
type answer struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// tally counts one phase's answers.
type tally struct {
	mu sync.Mutex
	// followUps and followHits by conversation kind: follow-up turns, and
	// those served with the previous turn's prompt cached (its whole
	// blocks).
	followUps, followHits map[string]int
	// repeats and repeatHits by kind: requests sent again right after
	// their answer, and those served with their whole prompt cached (all
	// but the last block when block-aligned: the engine computes the last
	// token).
	repeats, repeatHits map[string]int
	// misses lists the first few missed follow-ups and repeats.
	misses                []string
	requests, failed      atomic.Int64
	promptTokens, cachedT atomic.Int64
	firstErr              error
}

func newTally() *tally {
	return &tally{followUps: map[string]int{}, followHits: map[string]int{}, repeats: map[string]int{}, repeatHits: map[string]int{}}
}

func (t *tally) fail(err error) {
	t.failed.Add(1)
	t.mu.Lock()
	if t.firstErr == nil {
		t.firstErr = err
	}
	t.mu.Unlock()
}

// share returns hits/n over every kind, and the counts.
func share(hits, n map[string]int) (float64, int, int) {
	var h, all int
	for k, v := range n {
		all += v
		h += hits[k]
	}
	if all == 0 {
		return 0, 0, 0
	}
	return float64(h) / float64(all), h, all
}

// wholeBlocks is n tokens' whole engine blocks, in tokens.
func wholeBlocks(n int) int { return n / blockTokens * blockTokens }

// drive runs the conversations through base (the router), concurrency
// of them at once, each turn sent when the previous answer ended, until
// each has sent its turns before upto(conversation) (nil: all of them).
func drive(ctx context.Context, c *http.Client, base string, convs []*conversation, concurrency int, t *tally, upto func(*conversation) int) {
	ch := make(chan *conversation)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for cv := range ch {
				end := cv.turns
				if upto != nil {
					end = min(end, upto(cv))
				}
				runConversation(ctx, c, base, cv, end, t)
			}
		})
	}
	for _, cv := range convs {
		select {
		case ch <- cv:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
}

// runConversation sends cv's turns from its next one up to end.
func runConversation(ctx context.Context, c *http.Client, base string, cv *conversation, end int, t *tally) {
	if cv.msgs == nil {
		cv.msgs = []map[string]string{{"role": "system", "content": cv.system}}
	}
	msgs, prevPrompt := cv.msgs, cv.prevPrompt
	defer func() { cv.msgs, cv.prevPrompt = msgs, prevPrompt }()
	for ; cv.next < end; cv.next++ {
		turn := cv.next
		msgs = append(msgs, map[string]string{"role": "user",
			"content": fmt.Sprintf("Conversation %d, question %d: %s", cv.id, turn, strings.Repeat("please go on with the story. ", 3+cv.rng.IntN(10)))})
		req := map[string]any{"model": cv.model, "max_tokens": 4 + cv.rng.IntN(12), "messages": msgs}
		if cv.salt != "" {
			req["cache_salt"] = cv.salt
		}
		body, _ := json.Marshal(req)
		a, err := chat(ctx, c, base, body)
		t.requests.Add(1)
		if err != nil {
			t.fail(err)
			cv.next = cv.turns // a failed conversation ends
			return
		}
		t.count(a)
		cached := a.Usage.PromptTokensDetails.CachedTokens
		if turn > 0 {
			hit := cached >= wholeBlocks(prevPrompt)
			t.mu.Lock()
			t.followUps[cv.kind()]++
			if hit {
				t.followHits[cv.kind()]++
			} else if len(t.misses) < 10 {
				t.misses = append(t.misses, fmt.Sprintf("follow-up: conversation %d (%s) turn %d: %d of %d prompt tokens cached, the previous prompt had %d",
					cv.id, cv.kind(), turn, cached, a.Usage.PromptTokens, prevPrompt))
			}
			t.mu.Unlock()
		}
		if cv.repeats[turn] {
			r, err := chat(ctx, c, base, body)
			t.requests.Add(1)
			if err != nil {
				t.fail(err)
				cv.next = cv.turns
				return
			}
			t.count(r)
			rc, want := r.Usage.PromptTokensDetails.CachedTokens, wholeBlocks(r.Usage.PromptTokens-1)
			t.mu.Lock()
			t.repeats[cv.kind()]++
			if rc >= want {
				t.repeatHits[cv.kind()]++
			} else if len(t.misses) < 10 {
				t.misses = append(t.misses, fmt.Sprintf("repeat: conversation %d (%s) turn %d: %d of %d prompt tokens cached, want %d",
					cv.id, cv.kind(), turn, rc, r.Usage.PromptTokens, want))
			}
			t.mu.Unlock()
		}
		prevPrompt = a.Usage.PromptTokens
		content := ""
		if len(a.Choices) > 0 {
			content = a.Choices[0].Message.Content
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": content})
	}
}

func (t *tally) count(a *answer) {
	t.promptTokens.Add(int64(a.Usage.PromptTokens))
	t.cachedT.Add(int64(a.Usage.PromptTokensDetails.CachedTokens))
}

// chat posts body to base's /v1/chat/completions and reads the answer;
// a status other than 200, or an answer without usage or its cached
// tokens, is an error.
func chat(ctx context.Context, c *http.Client, base string, body []byte) (*answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %.300s", base, resp.Status, b)
	}
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%s: answer: %w", base, err)
	}
	if a.Usage.PromptTokens == 0 || a.Usage.PromptTokensDetails == nil {
		return nil, fmt.Errorf("%s: answer without usage.prompt_tokens_details: %.300s", base, b)
	}
	return &a, nil
}
