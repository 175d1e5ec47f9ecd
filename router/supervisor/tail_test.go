package supervisor

import (
	"fmt"
	"strings"
	"testing"
)

// A JSON log line longer than the kept line is still read as JSON: the
// suffix shows its level, message and error, cut at tailLineMax bytes.
func TestTailReadsLongJSONLines(t *testing.T) {
	tl := newTail()
	long := strings.Repeat("é", 150) // 300 bytes
	_, _ = tl.Write([]byte(`{"@level": "info", "@message": "skipped"}` + "\n"))
	_, _ = tl.Write([]byte(`{"@level": "error", "@message": "invalid plugin types", "@module": "switchyard_plugin", ` +
		`"@timestamp": "2026-12-01T20:25:53.252512Z", "error": "type \"a\" has inputs 99; ` + long + `"}` + "\n"))
	_, _ = tl.Write([]byte("plain " + strings.Repeat("x", 5000)))
	want := `error: invalid plugin types: type "a" has inputs 99; ` + strings.Repeat("é", 73) + "..."
	got := tl.suffix()
	if wantSuffix := fmt.Sprintf("; stderr: %q", want+" / plain "+strings.Repeat("x", 194)+"..."); got != wantSuffix {
		t.Fatalf("suffix:\n got %s\nwant %s", got, wantSuffix)
	}
}
