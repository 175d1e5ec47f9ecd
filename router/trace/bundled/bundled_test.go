package bundled

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// The embedded trace must be byte-for-byte the bundled testdata file, whose
// sha256 the traces README pins.
func TestConversationTraceMatchesOrigin(t *testing.T) {
	b, err := ConversationTrace()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	const want = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("sha256 = %s, want %s", got, want)
	}
	orig, err := os.ReadFile("../../../testdata/traces/" + Name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, orig) {
		t.Fatal("embedded trace differs from testdata")
	}
	if n := bytes.Count(b, []byte("\n")); n != 12031 {
		t.Fatalf("records = %d, want 12031", n)
	}
}
