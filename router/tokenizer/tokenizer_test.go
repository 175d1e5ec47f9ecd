package tokenizer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/prefix"
)

// Blocks refuses a prompt longer than its tokenizer takes, before calling
// it: ErrTooLong, so the caller keys it by characters.
func TestBlocksTooLong(t *testing.T) {
	f := loadFile(t, "bytebpe.json", nil)
	ctx := context.Background()
	long := strings.Repeat("a b ", MaxFilePromptBytes/4+1)
	if _, _, err := Blocks(ctx, f, Prompt{Text: long}, 16, 4); !errors.Is(err, ErrTooLong) {
		t.Fatalf("text over the limit: %v, want ErrTooLong", err)
	}
	msgs := []prefix.ChatMessage{{Role: "user", Content: long}}
	if _, _, err := Blocks(ctx, f, Prompt{Messages: msgs}, 16, 4); !errors.Is(err, ErrTooLong) {
		t.Fatalf("chat over the limit: %v, want ErrTooLong", err)
	}
	if _, ids, err := Blocks(ctx, f, Prompt{Text: long[:MaxFilePromptBytes]}, 16, 4); err != nil || len(ids) == 0 {
		t.Fatalf("text at the limit: %d ids, %v", len(ids), err)
	}
	if got := MaxPromptBytes(&Engine{}); got != MaxEnginePromptBytes {
		t.Errorf("engine limit %d", got)
	}
}
