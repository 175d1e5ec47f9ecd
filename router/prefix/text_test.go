package prefix

import (
	"hash/fnv"
	"math/bits"
	"slices"
	"strings"
	"testing"
)

func fnv64(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func TestTextBlocks(t *testing.T) {
	const bt, cpt = 4, 2 // 8-byte blocks
	text := "abcdefgh" + "ijklmnop" + "qrs"
	got := TextBlocks(text, bt, cpt)
	h0 := ChainHash(0, fnv64([]byte("abcdefgh")))
	want := []uint64{h0, ChainHash(h0, fnv64([]byte("ijklmnop")))}
	if !slices.Equal(got, want) {
		t.Fatalf("TextBlocks = %x, want %x (full blocks only, FNV-1a chained)", got, want)
	}
	// A shared prefix shares leading hashes; a change in block 1 changes
	// block 1 and every later one.
	other := TextBlocks("abcdefgh"+"ijklmnoX"+"qrstuvwx", bt, cpt)
	if other[0] != got[0] || other[1] == got[1] || len(other) != 3 {
		t.Fatalf("prefix sharing: %x vs %x", other, got)
	}
	// Equal block content at another position hashes differently (chained).
	rep := TextBlocks(strings.Repeat("abcdefgh", 2), bt, cpt)
	if rep[0] != got[0] || rep[1] == rep[0] {
		t.Fatalf("chaining: %x", rep)
	}
	for _, c := range []struct {
		text    string
		bt, cpt int
	}{{"short", bt, cpt}, {"", bt, cpt}, {text, 0, cpt}, {text, bt, 0}, {text, -1, cpt}} {
		if b := TextBlocks(c.text, c.bt, c.cpt); b != nil {
			t.Errorf("TextBlocks(%q, %d, %d) = %x, want nil", c.text, c.bt, c.cpt, b)
		}
	}
}

func TestTokenBlocks(t *testing.T) {
	ids := []int64{1, 2, 3, 128000, -1, 7, 9}
	got := TokenBlocks(ids, 3)
	content := func(v ...int64) uint64 {
		id := uint64(14695981039346656037)
		for _, x := range v {
			id = bits.RotateLeft64((id^uint64(x))*0x9e3779b97f4a7c15, 31)
		}
		return id
	}
	h0 := ChainHash(0, content(1, 2, 3))
	want := []uint64{h0, ChainHash(h0, content(128000, -1, 7))}
	if !slices.Equal(got, want) {
		t.Fatalf("TokenBlocks = %x, want %x", got, want)
	}
	// Every position and every bit counts.
	if a, b := TokenBlocks([]int64{1, 2, 3}, 3), TokenBlocks([]int64{2, 1, 3}, 3); a[0] == b[0] {
		t.Errorf("swapped ids hash equal")
	}
	if a, b := TokenBlocks([]int64{1 << 62, 0}, 2), TokenBlocks([]int64{0, 0}, 2); a[0] == b[0] {
		t.Errorf("a high bit is lost")
	}
	if b := TokenBlocks(ids[:2], 3); b != nil {
		t.Errorf("partial block hashed: %x", b)
	}
	if b := TokenBlocks(ids, 0); b != nil {
		t.Errorf("blockTokens 0: %x", b)
	}
}

func TestEstimateTokens(t *testing.T) {
	for _, c := range []struct {
		text string
		cpt  int
		want int
	}{{"", 4, 0}, {"a", 4, 1}, {"abcd", 4, 1}, {"abcde", 4, 2}, {"abc", 0, 0}} {
		if got := EstimateTokens(c.text, c.cpt); got != c.want {
			t.Errorf("EstimateTokens(%q, %d) = %d, want %d", c.text, c.cpt, got, c.want)
		}
	}
}

func TestRenderChat(t *testing.T) {
	got := RenderChat([]ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi\nthere"}, {Role: "assistant"}})
	if want := "system: be brief\nuser: hi\nthere\nassistant: \n"; got != want {
		t.Fatalf("RenderChat = %q, want %q", got, want)
	}
	if RenderChat(nil) != "" {
		t.Error("RenderChat(nil) not empty")
	}
	// A conversation extended by a turn keeps the earlier rendering as a
	// prefix, so its blocks are shared.
	a := RenderChat([]ChatMessage{{Role: "user", Content: strings.Repeat("x", 100)}})
	b := RenderChat([]ChatMessage{{Role: "user", Content: strings.Repeat("x", 100)}, {Role: "assistant", Content: "ok"}})
	if !strings.HasPrefix(b, a) {
		t.Error("extended conversation does not share the rendered prefix")
	}
}

// The tools line comes first, a message's fields follow its content line
// in a fixed order, and a present empty reasoning is written.
func TestRenderChatTools(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"f"}}]`
	got := RenderChatTools(tools, []ChatMessage{
		{Role: "user", Content: "weather?", Name: "ann"},
		{Role: "assistant", ToolCalls: `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`, Reasoning: "look", HasReasoning: true},
		{Role: "tool", Content: "18C", ToolCallID: "c1"},
		{Role: "assistant", Content: "ok", HasReasoning: true},
	})
	want := "tools: " + tools + "\n" +
		"user: weather?\nname: ann\n" +
		"assistant: \nreasoning: look\ntool_calls: [{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]\n" +
		"tool: 18C\ntool_call_id: c1\n" +
		"assistant: ok\nreasoning: \n"
	if got != want {
		t.Fatalf("RenderChatTools =\n%q\nwant\n%q", got, want)
	}
	if RenderChatTools("", []ChatMessage{{Role: "user", Content: "x"}}) != RenderChat([]ChatMessage{{Role: "user", Content: "x"}}) {
		t.Error("no tools: not RenderChat")
	}
}
