package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// tooLargePlugin serves a Decide that answers a task of request "big" the
// way the SDK answers a result over the message-size limit, a task of
// request "wrong-id" under a task id the router never sent, and any other
// task with row 0.
type tooLargePlugin struct{ plugin.NetRPCUnsupportedPlugin }

type tooLargeServer struct {
	pluginv1.UnimplementedPluginServer
}

func (tooLargeServer) Decide(stream pluginv1.Plugin_DecideServer) error {
	for {
		batch, err := stream.Recv()
		if err != nil {
			return nil
		}
		out := &pluginv1.DecideResults{}
		for _, task := range batch.GetTasks() {
			r := &pluginv1.DecideResult{TaskId: task.GetTaskId()}
			switch task.GetRequest().GetId() {
			case "big":
				r.Picked, r.Error = -1, pluginwire.TooLargeMessage(70<<20, shared.MaxMessageBytes)
			case "wrong-id":
				r.TaskId += 1_000_000
			}
			out.Results = append(out.Results, r)
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func (tooLargePlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, tooLargeServer{})
	return nil
}

func (tooLargePlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return New(ctx, conn, Options{}), nil
}

// TestDecideResultOverLimit: the SDK's answer to a result over the
// message-size limit fails its call with ErrResultTooLarge (not a closed
// plugin), and the stream goes on. (The SDK's side, that such a result is
// answered so, is package shared's TestDecideResultOverLimit; the whole
// path through a real plugin process is the supervisor's
// TestAnswerTooLarge.)
func TestDecideResultOverLimit(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{shared.PluginSetKey: tooLargePlugin{}})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })
	c := &shared.Candidates{IDs: []shared.WorkerID{1, 2}}
	// A call that waited for its deadline would fail with
	// DeadlineExceeded, not ErrResultTooLarge.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = rc.Decide(ctx, &Task{Request: &shared.Request{ID: "big"}, Candidates: c, Stages: []Stage{{Instance: "s", Weight: 1}}})
	want := fmt.Sprintf("exceeds the %d-byte limit", shared.MaxMessageBytes)
	if !errors.Is(err, ErrResultTooLarge) || errors.Is(err, ErrPluginClosed) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want ErrResultTooLarge with %q", err, want)
	}
	// The stream goes on.
	if got, err := rc.Decide(ctx, &Task{Request: &shared.Request{ID: "small"}, Candidates: c, Stages: []Stage{{Instance: "p"}}}); err != nil || got.Picked != 0 {
		t.Fatalf("small: %+v, %v", got, err)
	}
}

// TestUnknownTaskIDFailsFast: a result for a task id the router never
// sent is a protocol violation. The calls in flight fail at once with
// ErrProtocol (not at their deadlines, which could be a minute away), and
// the next call opens a new stream.
func TestUnknownTaskIDFailsFast(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{shared.PluginSetKey: tooLargePlugin{}})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })
	c := &shared.Candidates{IDs: []shared.WorkerID{1, 2}}
	// No deadline: only the protocol check can end this call.
	_, err = rc.Decide(context.Background(), &Task{Request: &shared.Request{ID: "wrong-id"}, Candidates: c, Stages: []Stage{{Instance: "p"}}})
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, ErrPluginClosed) || !strings.Contains(err.Error(), "a result for task 1000001, which the router never sent (task ids sent so far: 1 to 1)") {
		t.Fatalf("err = %v, want ErrProtocol naming task 1000001", err)
	}
	if got, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{ID: "small"}, Candidates: c, Stages: []Stage{{Instance: "p"}}}); err != nil || got.Picked != 0 {
		t.Fatalf("the next call: %+v, %v; want row 0 on a new stream", got, err)
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
	return New(ctx, conn, Options{}), nil
}

// TestDecideFrozenPluginHonoursDeadline: callers whose tasks cannot be sent
// (the plugin stopped reading) still return at their deadline.
func TestDecideFrozenPluginHonoursDeadline(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{shared.PluginSetKey: frozenPlugin{}})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })
	// About 160 KB a task: a few fill the stream's flow-control window.
	c := &shared.Candidates{}
	for i := range 20000 {
		c.IDs = append(c.IDs, shared.WorkerID(i+1))
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
			_, err := rc.Decide(ctx, &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "s"}}})
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

// sizedPlugin serves a Decide that answers every task with row 0 and
// records the encoded size of each DecideBatch it receives. Its client
// calls hold, once, before the first Send.
type sizedPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv  *sizedServer
	hold func(tasks int)
}

type sizedServer struct {
	pluginv1.UnimplementedPluginServer
	mu    sync.Mutex
	sizes []int
}

func (s *sizedServer) Decide(stream pluginv1.Plugin_DecideServer) error {
	for {
		batch, err := stream.Recv()
		if err != nil {
			return nil
		}
		s.mu.Lock()
		s.sizes = append(s.sizes, proto.Size(batch))
		s.mu.Unlock()
		out := &pluginv1.DecideResults{}
		for _, task := range batch.GetTasks() {
			out.Results = append(out.Results, &pluginv1.DecideResult{TaskId: task.GetTaskId()})
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func (p *sizedPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, p.srv)
	return nil
}

func (p *sizedPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return New(ctx, conn, Options{DecideBatch: p.hold}), nil
}

// TestDecideBatchesStayUnderTheMessageLimit: tasks that queue together
// and would exceed the message-size limit together go out in several
// DecideBatch messages, each within it, and every call is answered.
// One message of all of them failed the whole stream (ResourceExhausted),
// and with it every call pending on it: 100 requests of 1 MB of headers
// each at once made one 83 MB message under router serve.
func TestDecideBatchesStayUnderTheMessageLimit(t *testing.T) {
	const limit = 1 << 20 // under the test server's 4 MiB receive limit
	old := maxMessageBytes
	maxMessageBytes = limit
	t.Cleanup(func() { maxMessageBytes = old })

	const calls = 24 // about 7 MB together
	var rc *Client
	var once sync.Once
	p := &sizedPlugin{srv: &sizedServer{}, hold: func(int) {
		// Hold the first Send until every call is pending, so the rest
		// queue behind it and go out together.
		once.Do(func() {
			deadline := time.Now().Add(time.Minute)
			for rc.Pending() < calls && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		})
	}}
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{shared.PluginSetKey: p})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc = raw.(*Client)
	t.Cleanup(func() { _ = rc.Close() })

	c := &shared.Candidates{IDs: []shared.WorkerID{1, 2}}
	pad := strings.Repeat("x", 300<<10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, calls)
	for i := range calls {
		wg.Go(func() {
			req := &shared.Request{ID: fmt.Sprint(i), Metadata: map[string]string{"x-pad": pad}}
			_, errs[i] = rc.Decide(ctx, &Task{Request: req, Candidates: c, Stages: []Stage{{Instance: "p"}}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	p.srv.mu.Lock()
	defer p.srv.mu.Unlock()
	if len(p.srv.sizes) < 2 {
		t.Fatalf("the plugin got %d messages %v; want the %d tasks in several", len(p.srv.sizes), p.srv.sizes, calls)
	}
	for _, n := range p.srv.sizes {
		if n > limit {
			t.Errorf("a DecideBatch of %d bytes, over the %d-byte limit (all: %v)", n, limit, p.srv.sizes)
		}
	}
	if got := rc.sentTasks.Load(); got != calls {
		t.Errorf("%d tasks sent, want %d", got, calls)
	}
}

// brokenEventsPlugin serves an Events stream that fails at its first
// batch; its client reports a broken stream to broken.
type brokenEventsPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	broken chan error
}

type brokenEventsServer struct {
	pluginv1.UnimplementedPluginServer
}

func (brokenEventsServer) Events(stream pluginv1.Plugin_EventsServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	return errors.New("listener state lost")
}

func (brokenEventsPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, brokenEventsServer{})
	return nil
}

func (p brokenEventsPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return New(ctx, conn, Options{EventsBroken: func(err error) { p.broken <- err }}), nil
}

// TestEventsBrokenIsReportedOnce: an Events stream that fails while the
// client is open is reported once through Options.EventsBroken, and the
// events sent after it are dropped and counted; closing the client
// reports nothing.
func TestEventsBrokenIsReportedOnce(t *testing.T) {
	broken := make(chan error, 4)
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{shared.PluginSetKey: brokenEventsPlugin{broken: broken}})
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*Client)
	rc.SendEvents("c", []shared.Event{{Kind: shared.EventSent, RequestID: "a", Worker: 1, HasWorker: true}})
	select {
	case err := <-broken:
		if !errors.Is(err, ErrPluginClosed) {
			t.Fatalf("reported %v, want an ErrPluginClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the broken stream was not reported within a minute")
	}
	rc.SendEvents("c", []shared.Event{{Kind: shared.EventCompleted, RequestID: "a", Worker: 1, HasWorker: true}})
	if st := rc.EventStats(); st.Dropped != 2 {
		t.Fatalf("dropped %d events, want 2 (the failed one and the one after)", st.Dropped)
	}
	_ = rc.Close()
	select {
	case err := <-broken:
		t.Fatalf("reported again: %v", err)
	default:
	}
}
