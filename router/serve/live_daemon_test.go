package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/live"
)

// The tests here run a live.Daemon with this package's face (Face), as
// `router serve` does, where what they check is the face's: the
// runtime's own daemon tests are router/live's.

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// replaceFile writes content to path the way editors do: a temporary
// file renamed over it.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// runningDaemon is a live.Daemon serving this package's face on a
// loopback listener.
type runningDaemon struct {
	d    *live.Daemon
	base string
	logs *lockedBuffer
}

// startDaemon runs a live.Daemon with o and the face (drain 5 s) on a
// loopback listener, its logs in a buffer and workers probed every
// 200ms, and waits until it is ready. The test's cleanup stops it.
func startDaemon(t *testing.T, o live.DaemonOptions) *runningDaemon {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	o.Listener, o.Face = ln, Face(Options{DrainTimeout: 5 * time.Second})
	o.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	o.ScrapeInterval = 200 * time.Millisecond
	ready := make(chan struct{})
	o.OnReady = func() { close(ready) }
	d, err := live.NewDaemon(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Run returned %v before it was ready; logs:\n%s", err, logs)
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("not ready after a minute; logs:\n%s", logs)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("Run did not return within a minute of its context's end")
		}
	})
	return &runningDaemon{d: d, base: "http://" + ln.Addr().String(), logs: logs}
}

// waitWorkers waits until /readyz lists want, each ready.
func (rd *runningDaemon) waitWorkers(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, a := getReadyz(t, rd.base)
		ready := len(a.Workers) == len(want)
		for i, w := range a.Workers {
			ready = ready && w.Ready && w.Name == want[i]
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz workers %+v a minute on, want %v ready; logs:\n%s", a.Workers, want, rd.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// debugListener returns a loopback listener for the debug views and its
// base URL.
func debugListener(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, "http://" + ln.Addr().String()
}

// getJSON GETs url and decodes its 200 answer into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %s", url, resp.StatusCode, err, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// waitBlocks polls /debug/workers/NAME/blocks on the debug listener at
// base until cond holds (a minute at most).
func waitBlocks(t *testing.T, rd *runningDaemon, base, name, what string, cond func(live.DebugBlocks) bool) live.DebugBlocks {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var got live.DebugBlocks
		getJSON(t, base+"/debug/workers/"+name+"/blocks", &got)
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute; last %+v\nlogs:\n%s", what, got, rd.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
