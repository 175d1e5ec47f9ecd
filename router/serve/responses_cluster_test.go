package serve

import (
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router/live"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// TestDaemonReplicasShareResponses: two router replicas (a cluster block
// over one NATS server) in front of three mock engines, round-robin:
// conversations started through replica a continue through replica b on
// the engine that holds their responses (b never saw them: it learned
// the bindings through the shared session store), and again through b,
// which bound its own answers.
func TestDaemonReplicasShareResponses(t *testing.T) {
	ns := natskit.Start(t, 0)
	var blocks strings.Builder
	for _, name := range []string{"w0", "w1", "w2"} {
		m, err := mockworker.New(mockworker.Config{Model: "m", Speedup: 200})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		fmt.Fprintf(&blocks, "worker %q {\n  url = %q\n}\n", name, hs.URL)
	}
	start := func(replica string) *runningDaemon {
		policy := filepath.Join(t.TempDir(), "policy.hcl")
		replaceFile(t, policy, "policy \"rr\" {\n  picker \"rr\" {\n    type = \"round-robin\"\n  }\n}\nworker_selection {\n  aggregated = \"rr\"\n}\n"+blocks.String()+
			fmt.Sprintf("\ncluster {\n  nats      = %q\n  replica   = %q\n  name      = \"t\"\n  heartbeat = \"100ms\"\n  session_ttl = \"10m\"\n}\n", ns.ClientURL(), replica))
		rd := startDaemon(t, live.DaemonOptions{PolicyFile: policy})
		rd.waitWorkers(t, "w0", "w1", "w2")
		return rd
	}
	a, b := start("a"), start("b")
	bindings := regexp.MustCompile(`(?m)^switchyard_cluster_session_bindings (\S+)$`)
	mirrored := func(rd *runningDaemon) int {
		m := bindings.FindStringSubmatch(getText(t, rd.base+"/metrics"))
		if m == nil {
			return -1
		}
		n, _ := strconv.ParseFloat(m[1], 64)
		return int(n)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute\nlogs a:\n%s\nlogs b:\n%s", what, a.logs, b.logs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Both have joined the bucket once a warm-up response of a's reaches
	// b (a's writes before it joined were dropped: repeat).
	wait("b mirrors a's warm-up response", func() bool {
		responsesTurn(t, a, "", false)
		time.Sleep(20 * time.Millisecond)
		return mirrored(b) >= 1
	})
	base := mirrored(b)
	const n = 6
	ids, first := make([]string, n), make([]string, n)
	for i := range n {
		ids[i], first[i] = responsesTurn(t, a, "", i%2 == 1)
	}
	wait("b mirrors the conversations", func() bool { return mirrored(b) >= base+n })
	seen := map[string]bool{}
	for i := range n {
		seen[first[i]] = true
		id, w := responsesTurn(t, b, ids[i], i%2 == 0)
		if w != first[i] {
			t.Errorf("conversation %d: second turn through b on %s, want %s (the first turn's, through a)", i, w, first[i])
		}
		// b bound its own answer: the third turn through b again.
		if _, w := responsesTurn(t, b, id, false); w != first[i] {
			t.Errorf("conversation %d: third turn through b on %s, want %s", i, w, first[i])
		}
	}
	if len(seen) < 2 {
		t.Fatalf("the first turns all went to %v", first)
	}
}

// getText returns the body of GET url.
func getText(t *testing.T, url string) string {
	t.Helper()
	return string(getBody(t, url))
}
