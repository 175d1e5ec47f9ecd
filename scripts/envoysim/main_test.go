package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRunProxiesThroughTheEPP starts the proxy against an address where
// no endpoint picker listens: it serves, and a chat request through it is
// answered 500, as Envoy's ext_proc filter answers when the stream cannot
// open and failure_mode_allow is off (envoysim.Config.FailOpen).
func TestRunProxiesThroughTheEPP(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eppAddr := dead.Addr().String()
	_ = dead.Close()

	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var stderr strings.Builder
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--epp", eppAddr, "--listen", "127.0.0.1:0"}, pw, &stderr)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("no listening line: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	addr, ok := strings.CutPrefix(line, "envoysim listening on http://")
	if !ok || !strings.HasSuffix(line, " (ext_proc to "+eppAddr+", full-duplex)\n") {
		t.Fatalf("listening line %q", line)
	}
	addr = strings.Fields(addr)[0]
	client := &http.Client{Timeout: 2 * time.Minute}
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("status %d, want 500 (no endpoint picker)", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d after SIGTERM's cancel; stderr %q", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("did not stop within a minute")
	}
}

func TestRunUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"--mode", "streamed"}, {"extra"}, {"--no-such-flag"}} {
		var out, errb strings.Builder
		if code := run(context.Background(), args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and a message", args, code, errb.String())
		}
	}
}
