// Package bundled embeds the default replay trace, the Mooncake conversation
// trace (kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl,
// Apache-2.0; cite Mooncake, FAST '25), gzip-compressed, so `router replay`
// runs with no arguments. testdata/traces holds the same file uncompressed
// with its origin and licence.
package bundled

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"io"
)

// Name is the file name the bundled trace is reported under.
const Name = "mooncake_conversation_trace.jsonl"

//go:embed mooncake_conversation_trace.jsonl.gz
var conversationGz []byte

// ConversationTrace returns the uncompressed bundled trace (12,031 JSONL
// records, about 3 MB).
func ConversationTrace() ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(conversationGz))
	if err != nil {
		return nil, fmt.Errorf("bundled trace: %w", err)
	}
	defer zr.Close()
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("bundled trace: %w", err)
	}
	return b, nil
}
