package shared

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
)

// TestDecideResultOverLimit: a result over the message-size limit is
// answered with an error for its task, at once, and the stream goes on.
func TestDecideResultOverLimit(t *testing.T) {
	old := maxResultBytes
	maxResultBytes = 4096
	t.Cleanup(func() { maxResultBytes = old })
	rc := newTestClient(t)
	configure(t, rc, "s", "load", nil)
	big := &Candidates{}
	for i := range 1000 { // 1000 costs: 8000 bytes
		big.IDs = append(big.IDs, WorkerID(i+1))
		big.ActiveRequests = append(big.ActiveRequests, int64(i%7))
		big.Load = append(big.Load, Load{Available: true})
		big.OverlapBlocks = append(big.OverlapBlocks, 0)
	}
	// A call that waited for its deadline would fail with
	// DeadlineExceeded, not ErrResultTooLarge.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: big, Stages: []Stage{{Instance: "s", Weight: 1}}})
	if !errors.Is(err, ErrResultTooLarge) || errors.Is(err, ErrPluginClosed) ||
		!strings.Contains(err.Error(), "exceeds the 4096-byte limit") {
		t.Fatalf("err = %v, want ErrResultTooLarge with the limit", err)
	}
	// The stream goes on: a small result on it gets through.
	small := &Candidates{IDs: []WorkerID{1, 2}, ActiveRequests: []int64{3, 1}, Load: make([]Load, 2), OverlapBlocks: make([]int32, 2)}
	if got, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: small, Stages: []Stage{{Instance: "s", Weight: 1}}}); err != nil || len(got.Costs) != 2 {
		t.Fatalf("small: %+v, %v", got, err)
	}
	if rc.batches.Load() == 0 {
		t.Fatal("nothing sent")
	}
}

// TestDecideSendFailureEndsStream: when the plugin cannot send a result,
// it ends the stream, so the pending call fails at once (not at its
// deadline), and the next call opens a new stream.
func TestDecideSendFailureEndsStream(t *testing.T) {
	failures := 1
	hook := func() error {
		if failures > 0 {
			failures--
			return errors.New("injected send failure")
		}
		return nil
	}
	testHookServerSend.Store(&hook)
	t.Cleanup(func() { testHookServerSend.Store(nil) })
	rc := newTestClient(t)
	configure(t, rc, "p", "lowest", nil)
	c := &Candidates{IDs: []WorkerID{1, 2}, ActiveRequests: []int64{3, 1}, Costs: []float64{2, 1}}
	// A call that waited for its deadline would fail with
	// DeadlineExceeded, not ErrPluginClosed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}})
	if !errors.Is(err, ErrPluginClosed) || !strings.Contains(err.Error(), "injected send failure") {
		t.Fatalf("err = %v, want ErrPluginClosed with the send error", err)
	}
	got, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}})
	if err != nil || got.Picked != 1 {
		t.Fatalf("after the stream ended: %+v, %v", got, err)
	}
}

// frozenPlugin serves a Decide that never reads its stream, like a frozen
// plugin: HTTP/2 flow control then blocks the host's Sends.
type frozenPlugin struct{ plugin.NetRPCUnsupportedPlugin }

type frozenServer struct {
	pluginv1.UnimplementedPluginServer
}

func (frozenServer) Decide(stream pluginv1.Plugin_DecideServer) error {
	<-stream.Context().Done()
	return nil
}

func (frozenPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, frozenServer{})
	return nil
}

func (frozenPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewRemoteClient(ctx, conn), nil
}

// TestDecideFrozenPluginHonoursDeadline: callers whose tasks cannot be sent
// (the plugin stopped reading) still return at their deadline.
func TestDecideFrozenPluginHonoursDeadline(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{PluginSetKey: frozenPlugin{}})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*RemoteClient)
	t.Cleanup(func() { _ = rc.Close() })
	// About 160 KB a task: a few fill the stream's flow-control window.
	c := &Candidates{}
	for i := range 20000 {
		c.IDs = append(c.IDs, WorkerID(i+1))
		c.ActiveRequests = append(c.ActiveRequests, int64(i))
	}
	// The plugin never answers, so a call can only return by honouring its
	// deadline; one stuck in a blocked send would never return.
	const timeout = 50 * time.Millisecond
	var worst time.Duration
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			_, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "s"}}})
			errc <- err
		}()
		select {
		case err := <-errc:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("call %d: err = %v, want DeadlineExceeded", i, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("call %d has not returned a minute after its %v deadline", i, timeout)
		}
		cancel()
		worst = max(worst, time.Since(start))
	}
	sent := rc.sentTasks.Load()
	if sent >= 20 {
		t.Fatalf("all %d tasks were sent: the plugin's window never filled, so the test proves nothing", sent)
	}
	t.Logf("slowest of 20 calls: %v (deadline %v); %d tasks got through before flow control stopped the sender", worst, timeout, sent)
}

func TestRemoveSocketDir(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, sockets int, other bool) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for i := range sockets {
			l, err := net.Listen("unix", filepath.Join(dir, "plugin"+string(rune('0'+i))))
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			_ = l.Close()
		}
		if other {
			if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	exists := func(p string) bool {
		_, err := os.Lstat(p)
		return err == nil
	}

	ours := mk("sy-1", 2, false)
	if err := removeSocketDir(ours); err != nil || exists(ours) {
		t.Errorf("sy- directory of sockets: err %v, exists %v; want removed", err, exists(ours))
	}
	empty := mk("sy-2", 0, false)
	if err := removeSocketDir(empty); err != nil || exists(empty) {
		t.Errorf("empty sy- directory: err %v, exists %v; want removed", err, exists(empty))
	}
	mixed := mk("sy-3", 1, true)
	if err := removeSocketDir(mixed); err == nil || !exists(filepath.Join(mixed, "data")) {
		t.Errorf("sy- directory with a regular file: err %v; want it left alone", err)
	}
	foreign := mk("other", 1, false)
	if err := removeSocketDir(foreign); err != nil || !exists(foreign) {
		t.Errorf("directory not named sy-*: err %v, exists %v; want left alone", err, exists(foreign))
	}
	link := filepath.Join(base, "sy-link")
	if err := os.Symlink(mk("target", 1, false), link); err != nil {
		t.Fatal(err)
	}
	if err := removeSocketDir(link); err != nil || !exists(filepath.Join(base, "target")) {
		t.Errorf("sy- symlink: err %v; want left alone", err)
	}
	if err := removeSocketDir(""); err != nil {
		t.Errorf("no directory: %v", err)
	}
	if err := removeSocketDir(filepath.Join(base, "sy-missing")); err != nil {
		t.Errorf("missing directory: %v", err)
	}
}
