package pluginclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testkit.Main(m))
}

// inProcess is the SDK's plugin side (shared.GRPCPlugin) with this
// package's Client as its host side, for go-plugin's in-process test
// connection.
type inProcess struct {
	shared.GRPCPlugin
	opts Options
}

func (p *inProcess) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return New(ctx, conn, p.opts), nil
}

// serveInProcess serves types through go-plugin's in-process test
// connection and returns the dispensed client, with opts, and the server.
// Both are stopped at the end of the test.
func serveInProcess(t testing.TB, types []shared.TypeInfo, opts Options) (*Client, *plugin.GRPCServer) {
	t.Helper()
	ps := map[string]plugin.Plugin{shared.PluginSetKey: &inProcess{GRPCPlugin: shared.GRPCPlugin{Version: "1.2.3", Types: types}, opts: opts}}
	client, server := plugin.TestPluginGRPCConn(t, false, ps)
	t.Cleanup(func() {
		server.Stop() // before client.Close, whose Shutdown call would stop it concurrently
		_ = client.Close()
	})
	raw, err := client.Dispense(shared.PluginSetKey)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	rc, ok := raw.(*Client)
	if !ok {
		t.Fatalf("Dispense returned %T, want *Client", raw)
	}
	t.Cleanup(func() { _ = rc.Close() })
	return rc, server
}

// newTestClient serves testTypes in process and returns the client.
func newTestClient(t testing.TB) *Client {
	rc, _ := serveInProcess(t, testTypes(), Options{})
	return rc
}

// configure creates an instance and fails the test on any diagnostic.
func configure(t testing.TB, rc *Client, name, typ string, p shared.Params) shared.Inputs {
	t.Helper()
	in, diags, err := rc.Configure(context.Background(), ConfigureRequest{
		Info: shared.InstanceInfo{Name: name, Role: shared.RoleAggregated, BlockSize: 16}, Type: typ, Params: p,
	})
	if err != nil || len(diags) > 0 {
		t.Fatalf("Configure %s (%s): err %v, diagnostics %v", name, typ, err, diags)
	}
	return in
}

// TestTaskTravels: a task's request and candidates reach the plugin's
// components as the router sent them: every column, nil ones nil, the LOAD
// sentinels for unreported kv_usage and waiting undone.
func TestTaskTravels(t *testing.T) {
	rc := newTestClient(t)
	rec := newRecorder(t)
	configure(t, rc, "rec", "record", shared.Params{"recorder": rec.name})
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 50 {
		want := randomCandidates(rng)
		if rng.IntN(2) == 0 {
			want.Load, want.OverlapBlocks = nil, nil
		}
		if rng.IntN(2) == 0 {
			want.TotalKVBlocks = make([]int64, want.Len())
			for i := range want.TotalKVBlocks {
				want.TotalKVBlocks[i] = rng.Int64N(1000)
			}
			want.DPRanks = make([]uint32, want.Len())
		}
		if rng.IntN(2) == 0 {
			// LABELS: a name per row and 0 to 3 sorted labels, some rows
			// sharing one Labels as the router's workers' ranks do.
			want.Names, want.Labels = make([]string, want.Len()), make([]shared.Labels, want.Len())
			for i := range want.Names {
				want.Names[i] = fmt.Sprintf("w-%d", want.IDs[i])
				if i > 0 && rng.IntN(4) == 0 {
					want.Labels[i] = want.Labels[i-1]
					continue
				}
				own := map[string]string{}
				for range rng.IntN(4) {
					own[fmt.Sprint("k", rng.IntN(5))] = fmt.Sprint("v", rng.IntN(3))
				}
				want.Labels[i] = shared.LabelsOf(own)
			}
		}
		req := &shared.Request{ID: fmt.Sprint("r", iter), Model: "m", Role: shared.RoleDecode, PromptTokens: rng.IntN(5000),
			BlockSize: 16, BlockHashes: []uint64{rng.Uint64(), rng.Uint64()}, CachedPromptTokens: rng.IntN(100),
			SessionID: "s", Priority: rng.IntN(11) - 5}
		if rng.IntN(2) == 0 {
			req.Metadata = map[string]string{"x-tenant": "a"}
		}
		got, err := rc.Decide(context.Background(), &Task{Request: req, Candidates: want, Stages: []Stage{{Instance: "rec"}}})
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		if got.Kept == nil || len(got.Kept) != want.Len() || got.Picked != -1 {
			t.Fatalf("iter %d: result %+v, want every row kept and none picked", iter, got)
		}
		seenReq, seen := rec.last()
		if diff := cmp.Diff(req, &seenReq, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("iter %d: request (-sent +seen):\n%s", iter, diff)
		}
		if diff := cmp.Diff(want, &seen, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("iter %d: candidates (-sent +seen):\n%s", iter, diff)
		}
		if (want.Load == nil) != (seen.Load == nil) || (want.Costs == nil) != (seen.Costs == nil) {
			t.Fatalf("iter %d: a nil column must stay nil and a set one set", iter)
		}
	}
}

func TestDescribeRoundTrip(t *testing.T) {
	rc := newTestClient(t)
	got, err := rc.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := &Description{PluginVersion: "1.2.3", APIVersions: []uint32{shared.APIVersion}, Types: testTypes()}
	for i := range want.Types {
		want.Types[i].New = nil
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(shared.TypeInfo{}, "New")); diff != "" {
		t.Fatalf("Describe (-want +got):\n%s", diff)
	}
}

func TestConfigure(t *testing.T) {
	rc := newTestClient(t)
	tests := []struct {
		name       string
		typ        string
		role       shared.Role
		params     shared.Params
		wantInputs shared.Inputs
		wantDiags  []Diagnostic
	}{
		{name: "ok with defaults", typ: "load", wantInputs: shared.InputActiveRequests | shared.InputLoad | shared.InputCache},
		{name: "ok with every param type", typ: "load", params: shared.Params{"scale": 2.0, "offset": int64(1), "window": time.Second, "label": "x", "strict": true},
			wantInputs: shared.InputActiveRequests | shared.InputLoad | shared.InputCache},
		{name: "two bad params", typ: "load", params: shared.Params{"scale": -1.0, "offset": -2.0}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": must be a finite number >= 0, got -1`},
			{Param: "offset", Summary: `parameter "offset": must be a finite number >= 0, got -2`},
		}},
		{name: "param errors and a block error", typ: "load", role: "bogus", params: shared.Params{"scale": -1.0}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": must be a finite number >= 0, got -1`},
			{Param: "", Summary: "role bogus is not served"},
		}},
		{name: "wrong value type", typ: "load", params: shared.Params{"scale": "high"}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": got a string value, want number`},
		}},
		{name: "unsupported parameter", typ: "load", params: shared.Params{"nope": 1.0}, wantDiags: []Diagnostic{
			{Param: "nope", Summary: `unsupported parameter "nope" for type "load"`},
		}},
		{name: "missing required parameter", typ: "sleepy", wantDiags: []Diagnostic{
			{Param: "sleep", Summary: `missing required parameter "sleep"`},
		}},
		{name: "unknown type", typ: "nope", wantDiags: []Diagnostic{
			{Param: "", Summary: `unknown component type "nope"`},
		}},
		{name: "component does not implement its kind", typ: "liar", wantDiags: []Diagnostic{
			{Param: "", Summary: `type "liar": pluginclient.notAScorer does not implement the scorer interface`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			role := tt.role
			if role == "" {
				role = shared.RoleDecode
			}
			in, diags, err := rc.Configure(context.Background(), ConfigureRequest{
				Info: shared.InstanceInfo{Name: "p/" + tt.name, Role: role, BlockSize: 16}, Type: tt.typ, Params: tt.params,
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantDiags, diags, cmpopts.IgnoreFields(Diagnostic{}, "Detail")); diff != "" {
				t.Fatalf("diagnostics (-want +got):\n%s", diff)
			}
			if in != tt.wantInputs {
				t.Fatalf("inputs = %v, want %v", in, tt.wantInputs)
			}
		})
	}
}

func TestConfigureParamThatCannotTravel(t *testing.T) {
	rc := newTestClient(t)
	_, _, err := rc.Configure(context.Background(), ConfigureRequest{Info: shared.InstanceInfo{Name: "x"}, Type: "load", Params: shared.Params{"scale": []int{1}}})
	var pe *shared.ParamError
	if !errors.As(err, &pe) || pe.Param != "scale" {
		t.Fatalf("err = %v, want a *ParamError for scale", err)
	}
}

// randomCandidates returns 1..64 sorted rows with every column the test
// components read, and incoming costs half the time.
func randomCandidates(rng *rand.Rand) *shared.Candidates {
	n := 1 + rng.IntN(64)
	c := &shared.Candidates{
		IDs:            make([]shared.WorkerID, n),
		ActiveRequests: make([]int64, n),
		Load:           make([]shared.Load, n),
		OverlapBlocks:  make([]int32, n),
	}
	id := shared.WorkerID(0)
	for i := range n {
		id += 1 + shared.WorkerID(rng.IntN(3))
		c.IDs[i] = id
		c.ActiveRequests[i] = rng.Int64N(9)
		c.Load[i] = shared.Load{Available: rng.IntN(4) != 0, ActiveDecodeBlocks: rng.Int64N(100), ActivePrefillTokens: rng.Int64N(4096), ActiveRequests: c.ActiveRequests[i]}
		if rng.IntN(2) == 0 {
			c.Load[i].KVUsage, c.Load[i].HasKVUsage = rng.Float64(), true
		}
		if rng.IntN(2) == 0 {
			c.Load[i].Waiting, c.Load[i].HasWaiting = rng.Int64N(5), true
		}
		c.OverlapBlocks[i] = int32(rng.IntN(20))
	}
	if rng.IntN(2) == 0 {
		c.Costs = make([]float64, n)
		for i := range c.Costs {
			c.Costs[i] = rng.Float64() * 10
		}
	}
	return c
}

func cloneCandidates(c *shared.Candidates) *shared.Candidates {
	cl := func(s []int64) []int64 { return append([]int64(nil), s...) }
	out := &shared.Candidates{
		IDs:            append([]shared.WorkerID(nil), c.IDs...),
		ActiveRequests: cl(c.ActiveRequests),
		Load:           append([]shared.Load(nil), c.Load...),
		OverlapBlocks:  append([]int32(nil), c.OverlapBlocks...),
		TotalKVBlocks:  cl(c.TotalKVBlocks),
	}
	if c.Costs != nil {
		out.Costs = append([]float64(nil), c.Costs...)
	}
	return out
}

// localStage is one component run locally by runLocal.
type localStage struct {
	name   string
	comp   shared.Component
	weight float64
}

// runLocal runs stages in order over a copy of c the way the host pipeline
// does and reports the answer the way a DecideResult does: kept rows and
// picked row as indices into c, costs as the stages' own weighted sum.
func runLocal(t *testing.T, req *shared.Request, c *shared.Candidates, stages []localStage) TaskResult {
	t.Helper()
	ctx := context.Background()
	c = cloneCandidates(c)
	orig := make([]uint32, c.Len())
	for i := range orig {
		orig[i] = uint32(i)
	}
	var own []float64
	res := TaskResult{Picked: -1}
	filtered := false
	for _, st := range stages {
		switch comp := st.comp.(type) {
		case shared.Filter:
			filtered = true
			keep := make([]bool, c.Len())
			for i := range keep {
				keep[i] = true
			}
			if err := comp.Filter(ctx, req, c, keep); err != nil {
				t.Fatal(err)
			}
			var o []uint32
			var ow []float64
			for i, k := range keep {
				if k {
					o = append(o, orig[i])
					if own != nil {
						ow = append(ow, own[i])
					}
				}
			}
			orig, own = o, ow
			if c.Compact(keep) == 0 {
				return TaskResult{Kept: []uint32{}, Picked: -1, FilteredBy: st.name}
			}
		case shared.Scorer:
			costs := make([]float64, c.Len())
			if err := comp.Score(ctx, req, c, costs); err != nil {
				t.Fatal(err)
			}
			if own == nil {
				own = make([]float64, c.Len())
			}
			if c.Costs == nil {
				c.Costs = make([]float64, c.Len())
			}
			for i, v := range costs {
				own[i] += st.weight * v
				c.Costs[i] += st.weight * v
			}
		case shared.Picker:
			row, err := comp.Pick(ctx, req, c)
			if err != nil {
				t.Fatal(err)
			}
			res.Picked = int(orig[row])
		}
	}
	if filtered {
		res.Kept = orig
	}
	res.Costs = own
	return res
}

func TestDecideMatchesLocalPipeline(t *testing.T) {
	rc := newTestClient(t)
	rng := rand.New(rand.NewPCG(7, 11))
	req := &shared.Request{ID: "r1", Model: "m", Role: shared.RoleAggregated, PromptTokens: 100, BlockSize: 16, BlockHashes: []uint64{1, 2, 3}}
	for iter := range 300 {
		max := rng.Int64N(9)
		scale := rng.Float64() * 3
		weight := rng.Float64() * 2
		configure(t, rc, "f", "max-active", shared.Params{"max": max})
		configure(t, rc, "s", "load", shared.Params{"scale": scale})
		configure(t, rc, "p", "lowest", nil)
		c := randomCandidates(rng)
		stages := []Stage{{Instance: "f", Kind: shared.KindFilter}, {Instance: "s", Kind: shared.KindScorer, Weight: weight}, {Instance: "p", Kind: shared.KindPicker}}
		// Some tasks are a shorter run: filter only, or scorer+picker.
		switch iter % 3 {
		case 1:
			stages = stages[:1]
		case 2:
			stages = stages[1:]
		}
		got, err := rc.Decide(context.Background(), &Task{Request: req, Candidates: c, Stages: stages})
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		local := map[string]localStage{
			"f": {name: "f", comp: &maxActiveFilter{max: max}},
			"s": {name: "s", comp: &loadScorer{scale: scale}, weight: weight},
			"p": {name: "p", comp: lowestPicker{}},
		}
		var ls []localStage
		for _, st := range stages {
			ls = append(ls, local[st.Instance])
		}
		want := runLocal(t, req, c, ls)
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("iter %d (%d rows, %d stages): Decide vs local (-want +got):\n%s", iter, c.Len(), len(stages), diff)
		}
	}
}

func TestDecideFilteredBy(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "none-left", "max-active", shared.Params{"max": int64(0)})
	configure(t, rc, "p", "lowest", nil)
	c := &shared.Candidates{IDs: []shared.WorkerID{1, 2}, ActiveRequests: []int64{3, 5}}
	got, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c,
		Stages: []Stage{{Instance: "none-left"}, {Instance: "p"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := TaskResult{Kept: []uint32{}, Picked: -1, FilteredBy: "none-left"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestDecidePanicFailsOnlyItsTask(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "boom", "panicky", nil)
	configure(t, rc, "p", "lowest", nil)
	c := &shared.Candidates{IDs: []shared.WorkerID{1, 2}, ActiveRequests: []int64{3, 1}}
	stages := []Stage{{Instance: "boom", Weight: 1}, {Instance: "p"}}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	results := make([]TaskResult, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := "fine"
			if i%2 == 0 {
				model = "panic"
			}
			results[i], errs[i] = rc.Decide(context.Background(), &Task{Request: &shared.Request{Model: model}, Candidates: c, Stages: stages})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 {
			if err == nil || err.Error() != `plugin decide: scorer "boom" panicked: boom` ||
				!errors.Is(err, ErrComponentPanicked) || errors.Is(err, ErrPluginClosed) {
				t.Errorf("task %d: err = %v, want the panic naming the instance, as ErrComponentPanicked", i, err)
			}
			continue
		}
		if err != nil || results[i].Picked != 0 {
			t.Errorf("task %d: %+v, %v; want row 0", i, results[i], err)
		}
	}
	// The plugin keeps serving.
	if _, err := rc.Describe(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// panicMessage recognises the SDK's panic answer for the kinds a Decide
// task's stages have, and no other (pluginwire tests the wording itself).
func TestPanicMessageKinds(t *testing.T) {
	for _, k := range []shared.Kind{shared.KindFilter, shared.KindScorer, shared.KindPicker} {
		if msg := pluginwire.PanicMessage(k.String(), "x", "boom"); !panicMessage(msg) {
			t.Errorf("panicMessage(%q) = false", msg)
		}
	}
	if msg := pluginwire.PanicMessage(shared.KindClassifier.String(), "x", "boom"); panicMessage(msg) {
		t.Errorf("panicMessage(%q) = true; a classifier is not a Decide stage", msg)
	}
}

// TestWireNumberingFromProto: the router's side reads the wire's enums and
// input bits as the SDK's (package shared checks the other direction);
// values it does not know become invalid, unknown input bits are dropped.
func TestWireNumberingFromProto(t *testing.T) {
	inputs := map[uint32]shared.Inputs{1: shared.InputActiveRequests, 2: shared.InputOccupancy, 4: shared.InputLoad, 8: shared.InputCache,
		16: shared.InputCapacity, 32: shared.InputLabels, 1<<31 | 4: shared.InputLoad}
	for bit, in := range inputs {
		if got := inputsFromProto(bit); got != in {
			t.Errorf("wire inputs %#x -> %v, want %v", bit, got, in)
		}
	}
	kinds := map[pluginv1.Kind]shared.Kind{pluginv1.Kind_KIND_FILTER: shared.KindFilter, pluginv1.Kind_KIND_SCORER: shared.KindScorer,
		pluginv1.Kind_KIND_PICKER: shared.KindPicker, pluginv1.Kind_KIND_CLASSIFIER: shared.KindClassifier, 0: 0, 99: 0}
	for pk, k := range kinds {
		if got := kindFromProto(pk); got != k {
			t.Errorf("kind %v -> %v, want %v", pk, got, k)
		}
	}
	types := map[pluginv1.ParamType]shared.ParamType{pluginv1.ParamType_PARAM_TYPE_NUMBER: shared.Number, pluginv1.ParamType_PARAM_TYPE_INT: shared.Int,
		pluginv1.ParamType_PARAM_TYPE_BOOL: shared.Bool, pluginv1.ParamType_PARAM_TYPE_STRING: shared.String,
		pluginv1.ParamType_PARAM_TYPE_DURATION: shared.Duration, pluginv1.ParamType_PARAM_TYPE_STRING_LIST: shared.StringList,
		pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST: shared.NumberList, 0: 0, 99: 0}
	for wt, pt := range types {
		if got := paramTypeFromProto(wt); got != pt {
			t.Errorf("param type %v -> %v, want %v", wt, got, pt)
		}
	}
}

func TestDecideErrors(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "p", "lowest", nil)
	configure(t, rc, "s", "load", nil)
	tests := []struct {
		name string
		task *Task
		want string
	}{
		{"unknown instance", &Task{Request: &shared.Request{}, Candidates: &shared.Candidates{IDs: []shared.WorkerID{1}}, Stages: []Stage{{Instance: "ghost"}}},
			`unknown instance "ghost"`},
		{"picker not last", &Task{Request: &shared.Request{}, Candidates: &shared.Candidates{IDs: []shared.WorkerID{1}, ActiveRequests: []int64{0}},
			Stages: []Stage{{Instance: "p"}, {Instance: "p"}}}, `picker "p" is not the task's last stage`},
		{"non-finite cost", &Task{Request: &shared.Request{}, Candidates: &shared.Candidates{IDs: []shared.WorkerID{1}, ActiveRequests: []int64{1},
			Load: []shared.Load{{}}, OverlapBlocks: []int32{0}, Costs: []float64{math.MaxFloat64}},
			Stages: []Stage{{Instance: "s", Weight: math.MaxFloat64}}}, "scorer s: cost 1 at row 0 overflows the weighted sum"},
		{"no rows", &Task{Request: &shared.Request{}, Candidates: &shared.Candidates{}, Stages: []Stage{{Instance: "p"}}}, "no workers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rc.Decide(context.Background(), tt.task)
			if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, ErrComponentPanicked) {
				t.Fatalf("err = %v, want %q, not a panic", err, tt.want)
			}
		})
	}
}

// TestDecideCallerDeadline: a call returns at its caller's deadline while
// the plugin still holds its task (the gate is released only after the
// call returned), and the stream survives it.
func TestDecideCallerDeadline(t *testing.T) {
	rc := newTestClient(t)
	gate, release := newGate(t)
	configure(t, rc, "held", "gated", shared.Params{"gate": gate})
	configure(t, rc, "p", "lowest", nil)
	c := &shared.Candidates{IDs: []shared.WorkerID{1}, ActiveRequests: []int64{0}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := rc.Decide(ctx, &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "held"}}})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrPluginClosed) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	release()
	// The stream survives a caller's deadline.
	got, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}})
	if err != nil || got.Picked != 0 {
		t.Fatalf("after a deadline: %+v, %v", got, err)
	}
}

// TestLastAnswer: LastAnswer is zero until the plugin answers, moves with
// each answer, stays put while the plugin holds a task past its caller's
// deadline, and counts the late answer once it comes.
func TestLastAnswer(t *testing.T) {
	rc := newTestClient(t)
	if got := rc.LastAnswer(); !got.IsZero() {
		t.Fatalf("LastAnswer before any call = %v, want the zero time", got)
	}
	gate, release := newGate(t)
	configure(t, rc, "held", "gated", shared.Params{"gate": gate})
	configure(t, rc, "p", "lowest", nil)
	c := &shared.Candidates{IDs: []shared.WorkerID{1}, ActiveRequests: []int64{0}}
	before := time.Now()
	if _, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}}); err != nil {
		t.Fatal(err)
	}
	answered := rc.LastAnswer()
	if answered.Before(before) || answered.After(time.Now()) {
		t.Fatalf("LastAnswer = %v, want within the call (from %v)", answered, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := rc.Decide(ctx, &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "held"}}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if got := rc.LastAnswer(); !got.Equal(answered) {
		t.Errorf("LastAnswer = %v while the plugin holds the task, want %v (no answer since)", got, answered)
	}
	released := time.Now()
	release()
	deadline := time.Now().Add(time.Minute)
	for !rc.LastAnswer().After(answered) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := rc.LastAnswer(); got.Before(released) {
		t.Errorf("LastAnswer = %v, want the late answer, after the release at %v", got, released)
	}
}

// TestDecideConcurrentCallsBatch: calls that queue while a DecideBatch is
// being sent go out together in the next one, each answered as if it were
// alone, and Options.DecideBatch sees every batch's size. The first
// batch's observer holds the sender until every other caller has queued,
// so the batches are exactly the first caller's, then all the others'.
func TestDecideConcurrentCallsBatch(t *testing.T) {
	const callers = 64
	var (
		mu    sync.Mutex
		sizes []int
	)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	rc, _ := serveInProcess(t, testTypes(), Options{DecideBatch: func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			close(entered)
			<-release
		}
	}})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before rc.Close, which waits for the sender
	configure(t, rc, "f", "max-active", shared.Params{"max": int64(6)})
	configure(t, rc, "s", "load", nil)
	configure(t, rc, "p", "lowest", nil)
	decide := func(i int) {
		rng := rand.New(rand.NewPCG(uint64(i), 99))
		c := randomCandidates(rng)
		c.Costs = nil
		stages := []Stage{{Instance: "f"}, {Instance: "s", Weight: 1}, {Instance: "p"}}
		got, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{ID: "r"}, Candidates: c, Stages: stages})
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
			return
		}
		want := runLocal(t, &shared.Request{ID: "r"}, c, []localStage{
			{name: "f", comp: &maxActiveFilter{max: 6}}, {name: "s", comp: &loadScorer{scale: 1}, weight: 1}, {name: "p", comp: lowestPicker{}},
		})
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("caller %d (-want +got):\n%s", i, diff)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { decide(0) })
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the first call's batch was not sent within a minute")
	}
	for i := 1; i < callers; i++ {
		wg.Go(func() { decide(i) })
	}
	if !testkit.Poll(time.Minute, func() bool { return rc.Pending() == callers }) {
		t.Fatalf("%d calls pending a minute after %d started", rc.Pending(), callers)
	}
	releaseOnce.Do(func() { close(release) })
	wg.Wait()
	mu.Lock()
	got := slices.Clone(sizes)
	mu.Unlock()
	if want := []int{1, callers - 1}; !slices.Equal(got, want) {
		t.Errorf("batch sizes %v, want %v", got, want)
	}
	if rc.sentTasks.Load() != callers || rc.batches.Load() != 2 || rc.maxBatch.Load() != callers-1 {
		t.Errorf("counters: %d tasks in %d batches (largest %d), want %d in 2 (largest %d)",
			rc.sentTasks.Load(), rc.batches.Load(), rc.maxBatch.Load(), callers, callers-1)
	}
	if n := rc.Pending(); n != 0 {
		t.Errorf("Pending = %d after every call returned, want 0", n)
	}
}

// slowCallInFlight configures a "slow" instance that sleeps 10 s, starts a
// Decide of it over c with a live context, and returns once the task has
// been sent; the call's error arrives on the channel.
func slowCallInFlight(t *testing.T, rc *Client, c *shared.Candidates) <-chan error {
	t.Helper()
	configure(t, rc, "slow", "sleepy", shared.Params{"sleep": 10 * time.Second})
	errc := make(chan error, 1)
	go func() {
		_, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}})
		errc <- err
	}()
	for rc.sentTasks.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	return errc
}

func TestClientClose(t *testing.T) {
	rc := newTestClient(t)
	c := &shared.Candidates{IDs: []shared.WorkerID{1}}
	errc := slowCallInFlight(t, rc, c)
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrPluginClosed) {
			t.Fatalf("in-flight call: err = %v, want ErrPluginClosed", err)
		}
		// The stream's own context ended, not the caller's: a caller
		// that reads context.Canceled as "I gave up" must not see it.
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("in-flight call: err = %v wraps a context error; the caller's context is live", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("in-flight call did not fail after Close")
	}
	if _, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c}); !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("Decide after Close: err = %v, want ErrPluginClosed", err)
	}
	if _, err := rc.Describe(context.Background()); !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("Describe after Close: err = %v, want ErrPluginClosed", err)
	}
}

func TestStreamBreakFailsPendingAndReopens(t *testing.T) {
	rc, server := serveInProcess(t, testTypes(), Options{})
	c := &shared.Candidates{IDs: []shared.WorkerID{1}}
	errc := slowCallInFlight(t, rc, c)
	server.Stop() // the plugin goes away
	select {
	case err := <-errc:
		if !errors.Is(err, ErrPluginClosed) {
			t.Fatalf("pending call: err = %v, want ErrPluginClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("pending call did not fail when the plugin went away")
	}
	// A later call tries a new stream; the plugin is gone, so it fails too.
	_, err := rc.Decide(context.Background(), &Task{Request: &shared.Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}})
	if !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("call after the plugin died: err = %v, want ErrPluginClosed", err)
	}
}

// When the plugin's process context (New's done) ends, a call in flight
// fails as closed, and its error does not wrap context.Canceled: that
// context is the plugin's, and callers read a wrapped context.Canceled as
// their own cancellation (the router then skips the fallback).
func TestProcessDoneFailsCallsAsClosed(t *testing.T) {
	ps := map[string]plugin.Plugin{shared.PluginSetKey: &inProcess{GRPCPlugin: shared.GRPCPlugin{Version: "1.2.3", Types: testTypes()}}}
	client, server := plugin.TestPluginGRPCConn(t, false, ps)
	t.Cleanup(func() {
		server.Stop()
		_ = client.Close()
	})
	done, exited := context.WithCancel(context.Background())
	defer exited()
	rc := New(done, client.Conn, Options{})
	defer rc.Close()
	c := &shared.Candidates{IDs: []shared.WorkerID{1}}
	errc := slowCallInFlight(t, rc, c)
	exited()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrPluginClosed) || errors.Is(err, context.Canceled) {
			t.Fatalf("in-flight call: err = %v, want ErrPluginClosed without context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("in-flight call did not fail when the process context ended")
	}
}
