package live

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/internal/testkit/natskit"
	"github.com/switchyard-router/switchyard/router/mockworker"
)

// TestDaemonReplicasShareSessions: two daemons with the same three
// workers, a round-robin policy, the session-affinity classifier and a
// cluster block each: a conversation's first turn through a and its next
// turns through b, then a again, all land on the first turn's worker,
// which b never chose for it itself.
func TestDaemonReplicasShareSessions(t *testing.T) {
	ns := natskit.Start(t, 0)

	var workers []string
	for i := range 3 {
		m, err := mockworker.New(mockworker.Config{Speedup: 50})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(m)
		t.Cleanup(func() { hs.Close(); m.Close() })
		workers = append(workers, fmt.Sprintf("w%d=%s", i, hs.URL))
	}
	start := func(replica string) *runningDaemon {
		path := filepath.Join(t.TempDir(), "policy.hcl")
		policy := daemonPolicy("rr", workers...) +
			"\nrequest_classifier {\n  type = \"session-affinity\"\n  ttl  = \"10m\"\n}\n" +
			fmt.Sprintf("\ncluster {\n  nats      = %q\n  replica   = %q\n  name      = \"t\"\n  heartbeat = \"100ms\"\n  session_ttl = \"10m\"\n}\n", ns.ClientURL(), replica)
		if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
		rd := startDaemon(t, DaemonOptions{PolicyFile: path})
		rd.waitWorkers(t, "w0", "w1", "w2")
		return rd
	}
	a, b := start("a"), start("b")
	turn := func(rd *runningDaemon, session string) string {
		t.Helper()
		resp, err := post(t, context.Background(), rd.base+"/v1/chat/completions",
			`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`, "X-Session-Id", session)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v\nlogs a:\n%s\nlogs b:\n%s", session, resp.StatusCode, err, a.logs, b.logs)
		}
		return resp.Header.Get("X-Switchyard-Worker")
	}
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
	// Both have joined the bucket once a warm-up session of a's reaches b
	// (a's writes before it joined were dropped: repeat).
	wait("b mirrors a's warm-up session", func() bool {
		turn(a, "warm-up")
		time.Sleep(20 * time.Millisecond)
		return mirrored(b) == 1
	})
	const n = 6
	first := map[string]string{}
	for i := range n {
		s := fmt.Sprintf("conv-%d", i)
		first[s] = turn(a, s)
	}
	wait("b mirrors the conversations", func() bool { return mirrored(b) == 1+n })
	for s, w := range first {
		if got := turn(b, s); got != w {
			t.Errorf("%s: second turn through b on %s, want %s (the first turn's, through a)", s, got, w)
		}
		if got := turn(a, s); got != w {
			t.Errorf("%s: third turn through a on %s, want %s", s, got, w)
		}
	}
	// The first turns went round-robin: not all to one worker (else the
	// test above proves nothing).
	seen := map[string]bool{}
	for _, w := range first {
		seen[w] = true
	}
	if len(seen) < 2 {
		t.Fatalf("the first turns all went to %v", first)
	}
}
