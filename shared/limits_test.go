package shared

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// newWireClient serves types in process through go-plugin's test
// connection and returns the generated protocol client GRPCPlugin
// dispenses: the plugin side's tests speak switchyard.plugin.v1 directly.
func newWireClient(t *testing.T, types []TypeInfo) pluginv1.PluginClient {
	t.Helper()
	ps := map[string]plugin.Plugin{PluginSetKey: &GRPCPlugin{Version: "v", Types: types}}
	client, server := plugin.TestPluginGRPCConn(t, false, ps)
	t.Cleanup(func() {
		server.Stop() // before client.Close, whose Shutdown call would stop it concurrently
		_ = client.Close()
	})
	raw, err := client.Dispense(PluginSetKey)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	pc, ok := raw.(pluginv1.PluginClient)
	if !ok {
		t.Fatalf("Dispense returned %T, want a pluginv1.PluginClient", raw)
	}
	return pc
}

// configureWire creates an instance and fails the test on any diagnostic.
func configureWire(t *testing.T, pc pluginv1.PluginClient, name, typ string) {
	t.Helper()
	resp, err := pc.Configure(context.Background(), &pluginv1.ConfigureRequest{Instance: name, Type: typ, BlockSize: 16})
	if err != nil || len(resp.GetDiagnostics()) > 0 {
		t.Fatalf("Configure %s (%s): err %v, diagnostics %v", name, typ, err, resp.GetDiagnostics())
	}
}

// openDecide opens a Decide stream that ends with the test.
func openDecide(t *testing.T, pc pluginv1.PluginClient) pluginv1.Plugin_DecideClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := pc.Decide(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// oneTask sends one task on st and returns the first answer.
func oneTask(t *testing.T, st pluginv1.Plugin_DecideClient, task *pluginv1.DecideTask) (*pluginv1.DecideResults, error) {
	t.Helper()
	if err := st.Send(&pluginv1.DecideBatch{Tasks: []*pluginv1.DecideTask{task}}); err != nil {
		t.Fatal(err)
	}
	return st.Recv()
}

// TestDecideResultOverLimit: a result over the message-size limit is
// answered with an error for its task (pluginwire.TooLargeMessage, which
// the router recognises), at once, and the stream goes on.
func TestDecideResultOverLimit(t *testing.T) {
	old := maxResultBytes
	maxResultBytes = 4096
	t.Cleanup(func() { maxResultBytes = old })
	pc := newWireClient(t, testTypes())
	configureWire(t, pc, "s", "load")
	st := openDecide(t, pc)
	big := &pluginv1.Columns{}
	for i := range 1000 { // 1000 costs: 8000 bytes
		big.Ids = append(big.Ids, uint64(i+1))
		big.ActiveRequests = append(big.ActiveRequests, int64(i%7))
		big.OverlapBlocks = append(big.OverlapBlocks, 0)
	}
	big.LoadAvailable = make([]bool, 1000)
	big.LoadActivePrefillTokens = make([]int64, 1000)
	big.LoadActiveDecodeBlocks = make([]int64, 1000)
	big.LoadActiveRequests = make([]int64, 1000)
	big.LoadKvUsage = make([]float64, 1000)
	big.LoadWaiting = make([]int64, 1000)
	stages := []*pluginv1.Stage{{Instance: "s", Weight: 1}}
	out, err := oneTask(t, st, &pluginv1.DecideTask{TaskId: 1, Candidates: big, Stages: stages})
	if err != nil {
		t.Fatal(err)
	}
	r := out.GetResults()
	if len(r) != 1 || r[0].GetTaskId() != 1 || r[0].GetPicked() != -1 || len(r[0].GetCosts()) != 0 ||
		!pluginwire.IsTooLargeMessage(r[0].GetError()) || !strings.Contains(r[0].GetError(), "exceeds the 4096-byte limit") {
		t.Fatalf("results %v, want task 1's error naming the 4096-byte limit", r)
	}
	// The stream goes on: a small result on it gets through.
	small := &pluginv1.Columns{Ids: []uint64{1, 2}, ActiveRequests: []int64{3, 1}, OverlapBlocks: []int32{0, 0},
		LoadAvailable: make([]bool, 2), LoadActivePrefillTokens: make([]int64, 2), LoadActiveDecodeBlocks: make([]int64, 2),
		LoadActiveRequests: make([]int64, 2), LoadKvUsage: make([]float64, 2), LoadWaiting: make([]int64, 2)}
	out, err = oneTask(t, st, &pluginv1.DecideTask{TaskId: 2, Candidates: small, Stages: stages})
	if err != nil {
		t.Fatal(err)
	}
	if r := out.GetResults(); len(r) != 1 || r[0].GetTaskId() != 2 || r[0].GetError() != "" || !slices.Equal(r[0].GetCosts(), []float64{3, 1}) {
		t.Fatalf("small: results %v, want task 2's costs [3 1]", r)
	}
}

// TestDecideSendFailureEndsStream: when the plugin cannot send a result,
// it ends the stream at once with the send's error (so the host fails the
// calls pending on it, not at their deadline), and a new stream works.
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
	pc := newWireClient(t, testTypes())
	configureWire(t, pc, "p", "lowest")
	task := &pluginv1.DecideTask{TaskId: 1, Candidates: &pluginv1.Columns{Ids: []uint64{1, 2}, ActiveRequests: []int64{3, 1}, Costs: []float64{2, 1}},
		Stages: []*pluginv1.Stage{{Instance: "p"}}}
	_, err := oneTask(t, openDecide(t, pc), task)
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "injected send failure") {
		t.Fatalf("err = %v, want the stream ended (Internal) with the send error", err)
	}
	out, err := oneTask(t, openDecide(t, pc), task)
	if err != nil {
		t.Fatal(err)
	}
	if r := out.GetResults(); len(r) != 1 || r[0].GetError() != "" || r[0].GetPicked() != 1 {
		t.Fatalf("on a new stream: results %v, want row 1 picked", r)
	}
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
