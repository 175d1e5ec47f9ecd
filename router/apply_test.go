package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/supervisor"
	"github.com/switchyard-router/switchyard/shared"
)

// pluginBin is cmd/plugin-example, built by TestMain.
var pluginBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "router-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pluginBin = filepath.Join(dir, "plugin-example")
	if out, err := exec.Command("go", "build", "-o", pluginBin, "../cmd/plugin-example").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building cmd/plugin-example: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// highestID picks the last candidate: candidates come in ascending
// WorkerID order, so it always picks the highest worker id, a policy whose
// decisions are told apart from round-robin's at a glance.
type highestID struct{}

func (highestID) Inputs() shared.Inputs { return 0 }
func (highestID) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	return len(c.IDs) - 1, nil
}

const workers = 4 // ids 1..4

// writeFile replaces path's content the way editors do: a temporary file
// renamed over it.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func addWorkers(t *testing.T, r *Router) {
	t.Helper()
	for i := range workers {
		if _, err := r.AddWorker(fleet.Spec{ID: shared.WorkerID(i + 1), Role: shared.RoleAggregated, TotalKVBlocks: 100}); err != nil {
			t.Fatal(err)
		}
	}
}

func selectOne(t *testing.T, r *Router) Decision {
	t.Helper()
	d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 1024}, Placement{})
	if err != nil {
		t.Fatal(err)
	}
	d.Booking.Release()
	return d
}

// pluginPIDs lists the running processes of pluginBin.
func pluginPIDs() []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == pluginBin {
			pids = append(pids, e.Name())
		}
	}
	slices.Sort(pids)
	return pids
}

// gate is a picker that blocks until released: a decision held in flight.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 16), release: make(chan struct{})} }

func (*gate) Inputs() shared.Inputs { return 0 }
func (g *gate) Pick(ctx context.Context, _ *shared.Request, _ *shared.Candidates) (int, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func staticBundle(t *testing.T, name string, p shared.Picker) *Bundle {
	t.Helper()
	b, err := NewBundle(map[shared.Role]*policy.Policy{shared.RoleAggregated: {Name: name, PickerName: name, Picker: p}}, BundleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Apply switches new decisions at once; the one in flight finishes on the
// old bundle, whose Close waits for it.
func TestApplyDrainsTheOldBundle(t *testing.T) {
	g := newGate()
	bg := staticBundle(t, "gate", g)
	r, err := New(Options{BlockSize: 4, Bundle: bg, BookingsAreLoad: true})
	if err != nil {
		t.Fatal(err)
	}
	addWorkers(t, r)

	held := make(chan Decision, 1)
	go func() {
		d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8}, Placement{})
		if err != nil {
			t.Error(err)
		}
		held <- d
	}()
	<-g.entered

	bt := staticBundle(t, "top", highestID{})
	old, err := r.Apply(bt)
	if err != nil || old != bg {
		t.Fatalf("Apply = %p, %v; want the gate bundle %p", old, err, bg)
	}
	if d := selectOne(t, r); d.Policy != "top" || d.Worker.ID != workers {
		t.Fatalf("decision after Apply by %q for %d, want top for %d", d.Policy, d.Worker.ID, workers)
	}
	if n := bg.InFlight(); n != 1 {
		t.Fatalf("old bundle in flight = %d, want 1", n)
	}
	if _, err := r.Apply(bg); !errors.Is(err, ErrBundleInUse) {
		t.Fatalf("re-applying a retired bundle: %v, want ErrBundleInUse", err)
	}
	if err := bt.Close(context.Background()); !errors.Is(err, ErrBundleInUse) {
		t.Fatalf("closing the applied bundle: %v, want ErrBundleInUse", err)
	}

	closed := make(chan error, 1)
	go func() { closed <- bg.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a decision in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(g.release)
	if d := <-held; d.Policy != "gate" {
		t.Fatalf("the held decision was made by %q, want gate", d.Policy)
	} else {
		d.Booking.Release()
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the decision in flight ended")
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A drain is bounded: Close returns when ctx ends, saying what is in flight.
func TestCloseDrainTimeout(t *testing.T) {
	g := newGate()
	bg := staticBundle(t, "gate", g)
	r, err := New(Options{BlockSize: 4, Bundle: bg})
	if err != nil {
		t.Fatal(err)
	}
	addWorkers(t, r)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d, err := r.Place(context.Background(), &shared.Request{Role: shared.RoleAggregated, PromptTokens: 8}, Placement{}); err == nil {
			d.Booking.Release()
		}
	}()
	<-g.entered
	old, err := r.Apply(staticBundle(t, "top", highestID{}))
	if err != nil {
		t.Fatal(err)
	}
	// The decision is released only after Close returns: a Close that did
	// not honour its deadline would never return.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = old.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 decisions still in flight") {
		t.Fatalf("Close = %v; want the drain deadline with 1 decision in flight", err)
	}
	close(g.release)
	<-done
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRouterClose(t *testing.T) {
	r := newRouter(t, staticBundle(t, "x", highestID{}).roles[shared.RoleAggregated].policy, 2)
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Place(context.Background(), request(8), Placement{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Select after Close: %v, want ErrClosed", err)
	}
	if _, err := r.Apply(staticBundle(t, "y", highestID{})); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: %v, want ErrClosed", err)
	}
	if r.Hosted(shared.RoleAggregated) || r.Bundle() != nil {
		t.Fatal("a closed router still has a bundle")
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// loadFile loads the policy file at path into a bundle over its own
// plugin Host, as router/loader does (which this package cannot import in
// its tests): the core's shadow with a real plugin process.
func loadFile(t *testing.T, path string, reg prometheus.Registerer) (*Bundle, *supervisor.Host) {
	t.Helper()
	host := supervisor.NewHost(supervisor.Options{Registerer: reg})
	f, diags := config.LoadFileWith(path, catalog.Default(), config.Options{Plugins: host, Context: context.Background()})
	if diags.HasErrors() {
		_ = host.Shutdown(context.Background())
		t.Fatal(config.FormatDiagnostics(diags))
	}
	var more []*policy.Policy
	for _, d := range f.Decls {
		for _, p := range d.Instances {
			more = append(more, p)
		}
	}
	b, err := NewBundle(f.Roles, BundleOptions{Policies: more, Owned: true, BlockSize: f.BlockSize, Close: host.Shutdown})
	if err != nil {
		_ = host.Shutdown(context.Background())
		t.Fatal(err)
	}
	return b, host
}
