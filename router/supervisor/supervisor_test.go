package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/pipeline"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// testBin is the test plugin (testdata/plugin), built once by TestMain.
var testBin string

// tmpDir is the process's TMPDIR during the tests, so socket directories
// (TMPDIR/sy-*) can be counted without seeing other processes'.
var tmpDir string

func TestMain(m *testing.M) {
	if os.Getenv(sockOwnerEnv) != "" {
		os.Exit(runSockOwner())
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "supervisor-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	testBin = filepath.Join(dir, "plugin")
	build := exec.Command("go", "build", "-o", testBin, "./testdata/plugin")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the test plugin: %v\n%s", err, out)
		return 1
	}
	// A stop that runs out of killWait fails Shutdown: a minute, so that
	// only a stop that hangs does, not one on a starved machine.
	killWait = time.Minute
	tmpDir = filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmpDir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Setenv("TMPDIR", tmpDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
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

func testLogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "host", Output: testOutput(), Level: hclog.Debug})
}

// testOutput is where test hosts log: stderr with -v, else nowhere.
func testOutput() io.Writer {
	if testing.Verbose() {
		return os.Stderr
	}
	return io.Discard
}

// newHost returns a host shut down, and checked for leftovers, at the end
// of the test.
func newHost(t *testing.T) *Host {
	t.Helper()
	h := NewHost(Options{Logger: testLogger()})
	t.Cleanup(func() {
		if err := h.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		assertNoLeftovers(t)
	})
	return h
}

// block is a plugin block running the test plugin in mode. Its deadlines
// are generous, so that a busy machine misses none of them: a test about a
// deadline sets its own.
func block(name, mode string) config.Plugin {
	return config.Plugin{
		Name:         name,
		Command:      testBin,
		Env:          map[string]string{"SY_TEST_MODE": mode},
		StartTimeout: 30 * time.Second,
		CallTimeout:  30 * time.Second,
	}
}

// assertNoLeftovers fails unless no test plugin process runs and no socket
// directory is left.
func assertNoLeftovers(t *testing.T) {
	t.Helper()
	if pids := pluginPIDs(); len(pids) > 0 {
		t.Errorf("test plugin processes left: %v", pids)
	}
	if dirs, _ := filepath.Glob(filepath.Join(tmpDir, "sy-*")); len(dirs) > 0 {
		t.Errorf("socket directories left: %v", dirs)
	}
}

// pluginPIDs lists the running processes of testBin.
func pluginPIDs() []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == testBin {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// groupGone reports whether process group pgid has no running member left.
func groupGone(pgid int) bool { return !groupAlive(pgid) }

func typeByName(t *testing.T, types []shared.TypeInfo, name string) shared.TypeInfo {
	t.Helper()
	for _, ti := range types {
		if ti.Name == name {
			return ti
		}
	}
	t.Fatalf("type %q not among %d types", name, len(types))
	return shared.TypeInfo{}
}

func newInstance(t *testing.T, types []shared.TypeInfo, typ, name string, p shared.Params) shared.Component {
	t.Helper()
	ti := typeByName(t, types, typ)
	c, err := ti.New(shared.InstanceInfo{Name: name, Role: shared.RoleAggregated, BlockSize: 16}, ti.WithDefaults(p))
	if err != nil {
		t.Fatalf("New %s %q: %v", typ, name, err)
	}
	return c
}

// candidates are four workers with active requests 5, 2, 9, 3.
func candidates() *shared.Candidates {
	return &shared.Candidates{
		IDs:            []shared.WorkerID{10, 11, 12, 13},
		ActiveRequests: []int64{5, 2, 9, 3},
	}
}

var request = &shared.Request{ID: "r1", Model: "m", Role: shared.RoleAggregated, PromptTokens: 32, BlockSize: 16}

func TestStartRegistersTypes(t *testing.T) {
	h := newHost(t)
	t.Setenv("SY_HOST_SECRET", "must not leak")
	b := block("good", "")
	b.Env["EXTRA"] = "1"
	// A relative command resolves against the working directory.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if b.Command, err = filepath.Rel(wd, testBin); err != nil {
		t.Fatal(err)
	}
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	want := []shared.TypeInfo{
		{Name: "t-max-active", Kind: shared.KindFilter, Inputs: shared.InputActiveRequests,
			Params: []shared.ParamSpec{{Name: "max", Type: shared.Int, Default: int64(100), Doc: "most active requests kept"}},
			Doc:    "keeps workers with at most max active requests"},
		{Name: "t-active", Kind: shared.KindScorer, Inputs: shared.InputActiveRequests,
			Params: []shared.ParamSpec{
				{Name: "factor", Type: shared.Number, Default: 1.0, Doc: "cost per active request"},
				{Name: "delay", Type: shared.Duration, Doc: "sleep before scoring"},
			},
			// The plugin's environment is the block's: nothing of the host's.
			Doc: "env:EXTRA,SY_TEST_MODE"},
		{Name: "t-lowest", Kind: shared.KindPicker, Doc: "picks the lowest cost"},
	}
	if diff := cmp.Diff(want, types, cmpopts.IgnoreFields(shared.TypeInfo{}, "New")); diff != "" {
		t.Errorf("types (-want +got):\n%s", diff)
	}
	for _, ti := range types {
		if ti.New == nil {
			t.Errorf("type %q has no New", ti.Name)
		}
	}
	if _, err := h.Start(context.Background(), b); err == nil {
		t.Error("a second Start of the same plugin name succeeded")
	}
}

func TestNewConfigures(t *testing.T) {
	h := newHost(t)
	types, err := h.Start(context.Background(), block("good", ""))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	c := newInstance(t, types, "t-active", "agg/p/cost", shared.Params{"factor": 2.0})
	if got := c.Inputs(); got != shared.InputActiveRequests {
		t.Errorf("Inputs = %v, want ACTIVE_REQUESTS", got)
	}
	if _, ok := c.(shared.Scorer); !ok {
		t.Errorf("%T is not a Scorer", c)
	}

	scorer := typeByName(t, types, "t-active")
	_, err = scorer.New(shared.InstanceInfo{Name: "agg/p/bad", BlockSize: 16}, shared.Params{"factor": -1.0})
	var pe *shared.ParamError
	if !errors.As(err, &pe) || pe.Param != "factor" {
		t.Errorf("New with factor -1: got %v, want a *ParamError for factor", err)
	}

	picker := typeByName(t, types, "t-lowest")
	_, err = picker.New(shared.InstanceInfo{Name: "decode/p/pick", Role: shared.RoleDecode, BlockSize: 16}, nil)
	if err == nil || errors.As(err, &pe) || !strings.Contains(err.Error(), "does not pick decode workers") {
		t.Errorf("New for decode: got %v, want a block-level error", err)
	}
}

// testPolicy builds a filter+scorer+picker policy of the test plugin.
func testPolicy(t *testing.T, types []shared.TypeInfo, scorerParams shared.Params) *policy.Policy {
	t.Helper()
	return &policy.Policy{
		Name:       "p",
		Filters:    []policy.NamedFilter{{Name: "max", Type: "t-max-active", Filter: newInstance(t, types, "t-max-active", "agg/p/max", shared.Params{"max": int64(8)}).(shared.Filter)}},
		Scorers:    []policy.WeightedScorer{{Name: "cost", Type: "t-active", Weight: 1, Scorer: newInstance(t, types, "t-active", "agg/p/cost", scorerParams).(shared.Scorer)}},
		PickerName: "pick",
		PickerType: "t-lowest",
		Picker:     newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker),
	}
}

// startPolicy starts plugin block b on h and compiles the test policy
// (filter + scorer + picker) over its types.
func startPolicy(t *testing.T, h *Host, b config.Plugin) *pipeline.Compiled {
	t.Helper()
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cp, err := pipeline.Compile(testPolicy(t, types, nil))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return cp
}

func TestFusedPolicyIsOneCall(t *testing.T) {
	h := newHost(t)
	cp := startPolicy(t, h, block("good", ""))
	c := candidates()
	row, err := pipeline.Execute(context.Background(), cp, request, c, &pipeline.Scratch{})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	// Worker 12 (9 active) is filtered out; 11 (2 active) costs least.
	if got := c.IDs[row]; got != 11 {
		t.Errorf("picked worker %d, want 11", got)
	}
	if diff := cmp.Diff(Stats{Calls: 1}, h.Stats("good")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

func TestComponentsAlone(t *testing.T) {
	h := newHost(t)
	types, err := h.Start(context.Background(), block("good", ""))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ctx := context.Background()
	f := newInstance(t, types, "t-max-active", "agg/p/max", shared.Params{"max": int64(4)}).(shared.Filter)
	keep := []bool{true, true, true, true}
	if err := f.Filter(ctx, request, candidates(), keep); err != nil {
		t.Fatalf("Filter: %v", err)
	}
	if diff := cmp.Diff([]bool{false, true, false, true}, keep); diff != "" {
		t.Errorf("keep (-want +got):\n%s", diff)
	}
	s := newInstance(t, types, "t-active", "agg/p/cost", shared.Params{"factor": 0.5}).(shared.Scorer)
	costs := make([]float64, 4)
	if err := s.Score(ctx, request, candidates(), costs); err != nil {
		t.Fatalf("Score: %v", err)
	}
	if diff := cmp.Diff([]float64{2.5, 1, 4.5, 1.5}, costs); diff != "" {
		t.Errorf("costs (-want +got):\n%s", diff)
	}
	p := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)
	c := candidates()
	c.Costs = []float64{3, 2, 1, 4}
	if row, err := p.Pick(ctx, request, c); err != nil || row != 2 {
		t.Errorf("Pick = %d, %v; want 2", row, err)
	}
	// A scorer is not a picker.
	if _, err := s.(shared.Picker).Pick(ctx, request, c); err == nil {
		t.Error("Pick on a scorer succeeded")
	}
	if diff := cmp.Diff(Stats{Calls: 3}, h.Stats("good")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

func TestCallTimeout(t *testing.T) {
	h := newHost(t)
	b := block("slow", "")
	b.CallTimeout = 100 * time.Millisecond
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cp, err := pipeline.Compile(testPolicy(t, types, shared.Params{"delay": 5 * time.Second}))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	start := time.Now()
	_, err = pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
	// Not context.DeadlineExceeded, which is the caller's deadline: the
	// router falls back on ErrCallTimeout.
	if !errors.Is(err, ErrCallTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute: got %v, want ErrCallTimeout", err)
	}
	t.Logf("the call returned after %v, call_timeout is %v", time.Since(start), b.CallTimeout)
	if diff := cmp.Diff(Stats{Calls: 1, Timeouts: 1, Fallbacks: 1}, h.Stats("slow")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// procOf returns the running plugin's internals.
func procOf(t *testing.T, h *Host, name string) *proc {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.procs[name]
	if m == nil || m.cur.Load() == nil {
		t.Fatalf("plugin %q is not running", name)
	}
	return m.cur.Load()
}

func TestShutdownLeavesNothing(t *testing.T) {
	h := newHost(t)
	types, err := h.Start(context.Background(), block("good", ""))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	p := procOf(t, h, "good")
	if p.pid <= 0 || groupGone(p.pid) {
		t.Fatalf("plugin pid %d is not running", p.pid)
	}
	if pgid, err := syscall.Getpgid(p.pid); err != nil || pgid != p.pid {
		t.Errorf("plugin pgid = %d, %v; want its own group %d", pgid, err, p.pid)
	}
	if fi, err := os.Stat(p.sockDir); err != nil || fi.Mode().Perm() != 0o700 || filepath.Dir(p.sockDir) != tmpDir {
		t.Fatalf("socket directory %s: %v; want mode 0700 in %s", p.sockDir, err, tmpDir)
	}
	picker := newInstance(t, types, "t-lowest", "agg/p/pick", nil).(shared.Picker)

	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if !groupGone(p.pid) {
		t.Errorf("process group %d survived Shutdown", p.pid)
	}
	if _, err := os.Stat(p.sockDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory %s survived Shutdown: %v", p.sockDir, err)
	}
	assertNoLeftovers(t)

	c := candidates()
	c.Costs = []float64{1, 2, 3, 4}
	if _, err := picker.Pick(context.Background(), request, c); !errors.Is(err, pluginclient.ErrPluginClosed) {
		t.Errorf("Pick after Shutdown: got %v, want ErrPluginClosed", err)
	}
	var se *StartError
	if _, err := h.Start(context.Background(), block("late", "")); !errors.As(err, &se) || !errors.Is(err, ErrHostClosed) {
		t.Errorf("Start after Shutdown: got %v, want a *StartError wrapping ErrHostClosed", err)
	}
}

func TestShutdownDrainsInFlightCalls(t *testing.T) {
	h := NewHost(Options{Logger: testLogger(), ShutdownGrace: time.Minute}) // the call in flight ends first, however busy the machine
	t.Cleanup(func() { assertNoLeftovers(t) })
	types, err := h.Start(context.Background(), block("good", ""))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	slow := newInstance(t, types, "t-active", "agg/p/slow", shared.Params{"delay": 300 * time.Millisecond}).(shared.Scorer)
	fast := newInstance(t, types, "t-active", "agg/p/fast", nil).(shared.Scorer)
	p := procOf(t, h, "good")

	done := make(chan error, 1)
	go func() { done <- slow.Score(context.Background(), request, candidates(), make([]float64, 4)) }()
	for !inFlight(p) {
		time.Sleep(time.Millisecond)
	}
	shut := make(chan error, 1)
	go func() { shut <- h.Shutdown(context.Background()) }()
	for !closing(p) {
		time.Sleep(time.Millisecond)
	}
	if err := fast.Score(context.Background(), request, candidates(), make([]float64, 4)); !errors.Is(err, pluginclient.ErrPluginClosed) {
		t.Errorf("a call during Shutdown: got %v, want ErrPluginClosed", err)
	}
	if err := <-done; err != nil {
		t.Errorf("the call in flight failed: %v", err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

func inFlight(p *proc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight > 0
}

func closing(p *proc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closing
}

// TestPluginKilledMidRun: a run in flight when the plugin dies fails at
// once as closed, not at its call_timeout (a minute); a later run, while
// the plugin waits to be restarted, is refused without reaching a process.
func TestPluginKilledMidRun(t *testing.T) {
	h := newHost(t)
	// The restart waits an hour: the later run finds the plugin restarting.
	h.SetRestartPolicy("doomed", RestartPolicy{BackoffMin: time.Hour, BackoffMax: time.Hour})
	b := block("doomed", "")
	b.CallTimeout = time.Minute
	types, err := h.Start(context.Background(), b)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cp, err := pipeline.Compile(testPolicy(t, types, shared.Params{"delay": time.Minute}))
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	p := procOf(t, h, "doomed")
	done := make(chan error, 1)
	go func() {
		_, err := pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
		done <- err
	}()
	for !inFlight(p) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the task reach the plugin
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, pluginclient.ErrPluginClosed) {
			t.Errorf("the run in flight: got %v, want ErrPluginClosed", err)
		}
	case <-time.After(b.CallTimeout / 2):
		t.Fatal("the run in flight hangs after the plugin died")
	}
	if !testkit.Poll(time.Minute, func() bool { return h.Status("doomed") == StatusRestarting }) {
		t.Fatalf("status %v, want restarting", h.Status("doomed"))
	}
	_, err = pipeline.Execute(context.Background(), cp, request, candidates(), &pipeline.Scratch{})
	var ce *CallError
	if !errors.Is(err, pluginclient.ErrPluginClosed) || !errors.Is(err, ErrRestarting) || !errors.As(err, &ce) || ce.Cause != codeRestarting {
		t.Errorf("a later run: got %v, want ErrRestarting (cause restarting)", err)
	}
	if s := h.Stats("doomed"); s.Calls != 2 || s.Fallbacks != 2 || s.Errors != 2 {
		t.Errorf("Stats = %+v, want 2 calls, 2 errors, 2 fallbacks", s)
	}
}

func TestSHA256Pinned(t *testing.T) {
	h := newHost(t)
	sum, err := fileSHA256(testBin)
	if err != nil {
		t.Fatal(err)
	}
	b := block("pinned", "")
	b.SHA256 = sum
	marker := filepath.Join(t.TempDir(), "ran")
	b.Env["SY_MARKER"] = marker
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatalf("Start with the right sha256: %v", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the pinned plugin did not run: %v", err)
	}
}

func TestDescribe(t *testing.T) {
	h := newHost(t)
	desc, err := h.Describe(context.Background(), config.Plugin{Name: "plugin", Command: testBin, StartTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if desc.PluginVersion != "test" || len(desc.Types) != 3 {
		t.Errorf("Describe = %+v", desc)
	}
	for _, ti := range desc.Types {
		if ti.New != nil {
			t.Errorf("type %q has a New", ti.Name)
		}
	}
	assertNoLeftovers(t)
}

func TestBadPlugins(t *testing.T) {
	wrongSum := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		mode    string
		sha256  string
		dir     bool   // the command is a directory
		missing bool   // the command does not exist
		cause   string // substring of the error
		runs    int    // times the binary must have run
		// transient: a supervised restart that fails so is retried (a
		// starved machine can delay a handshake).
		transient bool
	}{
		{name: "cookie", mode: "cookie", cause: "exited before completing the handshake", runs: 1},
		{name: "version", mode: "version", cause: "unsupported API version", runs: 1},
		{name: "stdout", mode: "stdout", cause: `printed "hello from the plugin" on stdout instead of the handshake line`, runs: 1},
		{name: "fields", mode: "fields", cause: `the handshake line "1|1|unix" is malformed: it has 3 fields, the protocol expects 5 (CORE|APP|NETWORK|ADDRESS|PROTOCOL)`, runs: 1},
		{name: "fields4", mode: "fields4", cause: `unsupported plugin protocol "netrpc". Supported: [grpc]: the handshake line has 4 fields or names another protocol; the protocol expects 5 fields (CORE|APP|NETWORK|ADDRESS|PROTOCOL), the last one grpc`, runs: 1},
		{name: "hugeline", mode: "hugeline", cause: "the plugin wrote a line of more than 65536 bytes on stdout before its handshake line", runs: 1},
		{name: "tcp-remote", mode: "tcp-remote", cause: "the plugin gave TCP address 192.0.2.1:53; the router connects only to a unix socket or to 127.0.0.1:PORT (loopback), and did not connect", runs: 1},
		{name: "directory", dir: true, cause: " is a directory, not an executable file", runs: 0},
		{name: "missing", missing: true, cause: "no-such-plugin: no such file or directory", runs: 0},
		{name: "hang", mode: "hang", cause: "no handshake within start_timeout (2s)", runs: 1, transient: true},
		{name: "mute-socket", mode: "mute-socket", cause: "no gRPC connection within start_timeout (2s): the plugin accepted the connection but did not speak gRPC", runs: 1, transient: true},
		{name: "sha256", sha256: wrongSum, cause: "sha256 mismatch", runs: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log syncBuf
			h := NewHost(Options{Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: io.MultiWriter(&log, testOutput())})})
			t.Cleanup(func() {
				if err := h.Shutdown(context.Background()); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
				assertNoLeftovers(t)
			})
			dir := t.TempDir()
			b := block("bad-"+tt.name, tt.mode)
			b.StartTimeout = 2 * time.Second
			b.SHA256 = tt.sha256
			if tt.dir {
				b.Command = t.TempDir()
			}
			if tt.missing {
				b.Command = filepath.Join(t.TempDir(), "no-such-plugin")
			}
			b.Env["SY_STARTS"] = filepath.Join(dir, "starts")
			b.Env["SY_MARKER"] = filepath.Join(dir, "marker")

			start := time.Now()
			types, err := h.Start(context.Background(), b)
			elapsed := time.Since(start)
			var se *StartError
			if !errors.As(err, &se) {
				t.Fatalf("Start = %v, %v; want a *StartError", types, err)
			}
			if se.Plugin != b.Name || se.Permanent == tt.transient || IsPermanent(err) == tt.transient {
				t.Errorf("StartError{Plugin: %q, Permanent: %v}, want %q, permanent %v", se.Plugin, se.Permanent, b.Name, !tt.transient)
			}
			if msg := err.Error(); !strings.Contains(msg, `plugin "`+b.Name+`"`) || !strings.Contains(msg, tt.cause) {
				t.Errorf("error %q does not name the plugin and %q", msg, tt.cause)
			}
			if tt.name == "sha256" && !errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
				t.Errorf("error %v does not wrap go-plugin's ErrChecksumsDoNotMatch", err)
			}
			if tt.dir && !errors.Is(err, config.ErrCommandIsDirectory) {
				t.Errorf("error %v does not wrap config.ErrCommandIsDirectory", err)
			}
			// The router ended the process (or there was none): no
			// graceful exit was tried, so none failed.
			if got := log.String(); strings.Contains(got, "failed to exit gracefully") {
				t.Errorf("a failed start logged a warning that the plugin failed to exit gracefully:\n%s", got)
			}
			t.Logf("Start failed after %v, start_timeout is %v", elapsed, b.StartTimeout)
			assertNoLeftovers(t)

			// Nothing restarts it.
			time.Sleep(300 * time.Millisecond)
			starts, _ := os.ReadFile(b.Env["SY_STARTS"])
			if n := strings.Count(string(starts), "\n"); n != tt.runs {
				t.Errorf("the binary ran %d times, want %d", n, tt.runs)
			}
			if _, err := os.Stat(b.Env["SY_MARKER"]); (err == nil) != (tt.runs > 0) {
				t.Errorf("marker file: %v, want it to exist: %v", err, tt.runs > 0)
			}
		})
	}
}

// A plugin that closes file descriptor 3 (the router's exit pipe) has
// not exited: it starts and serves, and its real exit is still seen.
func TestPluginClosingFD3(t *testing.T) {
	h := newHost(t)
	if _, err := h.Start(context.Background(), block("closefd3", "closefd3")); err != nil {
		t.Fatalf("Start: %v", err)
	}
	p := procOf(t, h, "closefd3")
	select {
	case <-p.exited:
		t.Fatal("the plugin that closed fd 3 is taken as exited")
	case <-time.After(500 * time.Millisecond):
	}
	if !p.pidWatched {
		t.Skip("no pidfd on this kernel: the exit pipe is the only exit watch")
	}
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the killed plugin's exit was not seen within 60 s")
	}
}

// checkAddr accepts unix sockets and loopback TCP addresses only.
func TestCheckAddr(t *testing.T) {
	for _, tt := range []struct {
		addr net.Addr
		ok   bool
	}{
		{&net.UnixAddr{Net: "unix", Name: "/tmp/sy-1/plugin1"}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 10000}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 1, 2, 3), Port: 10000}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 10000}, true},
		{&net.TCPAddr{IP: net.IPv4(8, 8, 8, 8), Port: 53}, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 10000}, false},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 10000}, false},
		{&net.TCPAddr{Port: 10000}, false},
	} {
		err := checkAddr(tt.addr)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, errRemoteAddr) {
			t.Errorf("checkAddr(%v) = %v, want ok %v", tt.addr, err, tt.ok)
		}
	}
}

func TestShutdownKillsTheWholeGroup(t *testing.T) {
	h := newHost(t)
	b := block("parent", "child")
	childFile := filepath.Join(t.TempDir(), "child")
	b.Env["SY_CHILD"] = childFile
	if _, err := h.Start(context.Background(), b); err != nil {
		t.Fatalf("Start: %v", err)
	}
	p := procOf(t, h, "parent")
	raw, err := os.ReadFile(childFile)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	if pgid, err := syscall.Getpgid(child); err != nil || pgid != p.pid {
		t.Fatalf("child %d: pgid %d, %v; want %d", child, pgid, err, p.pid)
	}
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if !groupGone(p.pid) {
		t.Errorf("process group %d (child %d) survived Shutdown", p.pid, child)
	}
}

func TestShutdownWedgedPlugin(t *testing.T) {
	h := newHost(t)
	if _, err := h.Start(context.Background(), block("wedged", "")); err != nil {
		t.Fatalf("Start: %v", err)
	}
	p := procOf(t, h, "wedged")
	stopProcess(t, p.pid)
	// Every step of stopping a wedged plugin is bounded (killWait); one
	// that ran out would make Shutdown return an error.
	start := time.Now()
	if err := h.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	t.Logf("Shutdown of a wedged plugin took %v", time.Since(start))
	if !groupGone(p.pid) {
		t.Errorf("process group %d survived Shutdown", p.pid)
	}
}

func TestConcurrentDecisions(t *testing.T) {
	h := newHost(t)
	cp := startPolicy(t, h, block("good", ""))
	const workers, each = 16, 25
	errs := make(chan error, workers)
	for range workers {
		go func() {
			s := &pipeline.Scratch{}
			for range each {
				c := candidates()
				row, err := pipeline.Execute(context.Background(), cp, request, c, s)
				if err == nil && c.IDs[row] != 11 {
					err = fmt.Errorf("picked worker %d, want 11", c.IDs[row])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if diff := cmp.Diff(Stats{Calls: workers * each}, h.Stats("good")); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}
