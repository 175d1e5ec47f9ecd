//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestServeE2ESIGTERMLosesNoRequest: the router binary with two mock
// workers and 32 clients, each on its own keep-alive connection, sending
// requests back to back (a third of them streamed) when SIGTERM arrives.
// Every request a client wrote gets its whole answer; the only other end
// of a client's run is a refused connection, before anything was written
// (the listener closed). Three routers in turn, one SIGTERM each; each
// exits 0.
func TestServeE2ESIGTERMLosesNoRequest(t *testing.T) {
	routerBin, _ := e2eBinaries(t)
	mocks := startMocks(t, routerBin, 2, "1000")
	names := []string{"a", "b"}
	urls := map[string]string{"a": mocks[0].url, "b": mocks[1].url}
	policy := writeFile(t, "sigterm.hcl", "router {\n  block_size = 16\n}\n\n"+workerBlocks(names, urls))
	for round := range 3 {
		router := startRouter(t, routerBin, "--policy", policy, "--drain-timeout", "30s")
		waitMetrics(t, e2eClient(t), router, time.Minute, "both workers ready", allReady(names...))

		const clients = 32
		var answered, refused atomic.Int64
		var mu sync.Mutex
		var lost []string
		var wg sync.WaitGroup
		deadline := time.Now().Add(2 * time.Minute)
		for i := range clients {
			tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
			c := &http.Client{Transport: tr, Timeout: time.Minute}
			wg.Go(func() {
				defer tr.CloseIdleConnections()
				for n := 0; time.Now().Before(deadline); n++ {
					stream := (i+n)%3 == 0
					r, err := doChat(context.Background(), c, router.url, chatJSON(stream, 4, fmt.Sprintf("client %d request %d", i, n)))
					var op *net.OpError
					switch {
					case err != nil && errors.As(err, &op) && op.Op == "dial":
						refused.Add(1) // nothing was written: the listener is closed
						return
					case err != nil:
						mu.Lock()
						lost = append(lost, fmt.Sprintf("client %d request %d: %v", i, n, err))
						mu.Unlock()
					case r.status != http.StatusOK || (stream && !r.done) || (!stream && !strings.Contains(r.body, `"choices"`)):
						mu.Lock()
						lost = append(lost, fmt.Sprintf("client %d request %d (stream %v): status %d, [DONE] %v, body %q", i, n, stream, r.status, r.done, r.body))
						mu.Unlock()
					default:
						answered.Add(1)
					}
				}
			})
		}
		// Every client has been answered a few times: SIGTERM.
		for answered.Load() < 10*clients && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		before := answered.Load()
		_ = syscall.Kill(router.cmd.Process.Pid, syscall.SIGTERM)
		wg.Wait()
		select {
		case <-router.done:
		case <-time.After(time.Minute):
			t.Fatalf("round %d: the router did not exit within a minute of SIGTERM\n%s", round, router.stderr.String())
		}
		if code := router.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("round %d: the router exited %d after SIGTERM, want 0\n%s", round, code, router.stderr.String())
		}
		t.Logf("round %d: %d answers before SIGTERM, %d after; %d clients refused", round, before, answered.Load()-before, refused.Load())
		if refused.Load() != clients {
			t.Errorf("round %d: %d of %d clients ended on a refused connection", round, refused.Load(), clients)
		}
		for _, l := range lost {
			t.Errorf("round %d: written, not answered: %s", round, l)
		}
		if len(lost) > 0 {
			t.Fatalf("round %d: %d requests lost at SIGTERM; router stderr:\n%s", round, len(lost), router.stderr.String())
		}
	}
}
