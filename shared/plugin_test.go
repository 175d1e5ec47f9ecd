package shared

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeBuiltPlugin() }))
}

// newTestClient serves testTypes in-process through go-plugin's test
// connection and returns the dispensed host-side client.
func newTestClient(t testing.TB) *RemoteClient {
	t.Helper()
	ps := map[string]plugin.Plugin{PluginSetKey: &GRPCPlugin{Version: "1.2.3", Types: testTypes()}}
	client, server := plugin.TestPluginGRPCConn(t, false, ps)
	t.Cleanup(func() {
		server.Stop() // before client.Close, whose Shutdown call would stop it concurrently
		_ = client.Close()
	})
	raw, err := client.Dispense(PluginSetKey)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	rc, ok := raw.(*RemoteClient)
	if !ok {
		t.Fatalf("Dispense returned %T, want *RemoteClient", raw)
	}
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// configure creates an instance and fails the test on any diagnostic.
func configure(t testing.TB, rc *RemoteClient, name, typ string, p Params) Inputs {
	t.Helper()
	in, diags, err := rc.Configure(context.Background(), ConfigureRequest{
		Info: InstanceInfo{Name: name, Role: RoleAggregated, BlockSize: 16}, Type: typ, Params: p,
	})
	if err != nil || len(diags) > 0 {
		t.Fatalf("Configure %s (%s): err %v, diagnostics %v", name, typ, err, diags)
	}
	return in
}

func TestWireNumberingMatchesSDK(t *testing.T) {
	// The ComponentType.inputs comment: 1 ACTIVE_REQUESTS, 2 OCCUPANCY,
	// 4 LOAD, 8 CACHE, 16 CAPACITY.
	inputs := map[Inputs]uint32{InputActiveRequests: 1, InputOccupancy: 2, InputLoad: 4, InputCache: 8, InputCapacity: 16}
	for in, bit := range inputs {
		if inputsToProto(in) != bit || inputsFromProto(bit) != in {
			t.Errorf("input %v: wire bit %d, want %d", in, inputsToProto(in), bit)
		}
	}
	if AllInputs != 31 {
		t.Errorf("AllInputs = %d; a new input needs a wire bit and this test", AllInputs)
	}
	kinds := map[Kind]pluginv1.Kind{KindFilter: pluginv1.Kind_KIND_FILTER, KindScorer: pluginv1.Kind_KIND_SCORER,
		KindPicker: pluginv1.Kind_KIND_PICKER, KindClassifier: pluginv1.Kind_KIND_CLASSIFIER}
	for k, pk := range kinds {
		if kindToProto(k) != pk || kindFromProto(pk) != k {
			t.Errorf("kind %v <-> %v", k, pk)
		}
	}
	types := map[ParamType]pluginv1.ParamType{Number: pluginv1.ParamType_PARAM_TYPE_NUMBER, Int: pluginv1.ParamType_PARAM_TYPE_INT,
		Bool: pluginv1.ParamType_PARAM_TYPE_BOOL, String: pluginv1.ParamType_PARAM_TYPE_STRING, Duration: pluginv1.ParamType_PARAM_TYPE_DURATION}
	for pt, wt := range types {
		if paramTypeToProto(pt) != wt || paramTypeFromProto(wt) != pt {
			t.Errorf("param type %v <-> %v", pt, wt)
		}
	}
}

func TestCandidatesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		want := randomCandidates(rng)
		if rng.IntN(2) == 0 {
			want.Load, want.OverlapBlocks = nil, nil
		}
		want.TotalKVBlocks = nil
		if rng.IntN(2) == 0 {
			want.TotalKVBlocks = make([]int64, want.Len())
			for i := range want.TotalKVBlocks {
				want.TotalKVBlocks[i] = rng.Int64N(1000)
			}
			want.DPRanks = make([]uint32, want.Len())
		}
		var cols pluginv1.Columns
		candidatesToProto(want, &cols)
		var got Candidates
		if err := candidatesFromProto(&cols, &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, &got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip (-want +got):\n%s", diff)
		}
		if (want.Load == nil) != (got.Load == nil) || (want.Costs == nil) != (got.Costs == nil) {
			t.Fatal("a nil column must stay nil and a set one set")
		}
	}
}

func TestCandidatesFromProtoRejectsBadColumns(t *testing.T) {
	tests := []struct {
		name string
		cols *pluginv1.Columns
		want string
	}{
		{"short column", &pluginv1.Columns{Ids: []uint64{1, 2}, ActiveRequests: []int64{1}}, "column active_requests has 1 entries for 2 rows"},
		{"partial load", &pluginv1.Columns{Ids: []uint64{1}, LoadAvailable: []bool{true}}, "load columns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := candidatesFromProto(tt.cols, &Candidates{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestDescribeRoundTrip(t *testing.T) {
	rc := newTestClient(t)
	got, err := rc.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := &Description{PluginVersion: "1.2.3", APIVersions: []uint32{APIVersion}, Types: testTypes()}
	for i := range want.Types {
		want.Types[i].New = nil
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(TypeInfo{}, "New")); diff != "" {
		t.Fatalf("Describe (-want +got):\n%s", diff)
	}
}

func TestConfigure(t *testing.T) {
	rc := newTestClient(t)
	tests := []struct {
		name       string
		typ        string
		role       Role
		params     Params
		wantInputs Inputs
		wantDiags  []Diagnostic
	}{
		{name: "ok with defaults", typ: "load", wantInputs: InputActiveRequests | InputLoad | InputCache},
		{name: "ok with every param type", typ: "load", params: Params{"scale": 2.0, "offset": int64(1), "window": time.Second, "label": "x", "strict": true},
			wantInputs: InputActiveRequests | InputLoad | InputCache},
		{name: "two bad params", typ: "load", params: Params{"scale": -1.0, "offset": -2.0}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": must be a finite number >= 0, got -1`},
			{Param: "offset", Summary: `parameter "offset": must be a finite number >= 0, got -2`},
		}},
		{name: "param errors and a block error", typ: "load", role: "bogus", params: Params{"scale": -1.0}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": must be a finite number >= 0, got -1`},
			{Param: "", Summary: "role bogus is not served"},
		}},
		{name: "wrong value type", typ: "load", params: Params{"scale": "high"}, wantDiags: []Diagnostic{
			{Param: "scale", Summary: `parameter "scale": got a string value, want number`},
		}},
		{name: "unsupported parameter", typ: "load", params: Params{"nope": 1.0}, wantDiags: []Diagnostic{
			{Param: "nope", Summary: `unsupported parameter "nope" for type "load"`},
		}},
		{name: "missing required parameter", typ: "sleepy", wantDiags: []Diagnostic{
			{Param: "sleep", Summary: `missing required parameter "sleep"`},
		}},
		{name: "unknown type", typ: "nope", wantDiags: []Diagnostic{
			{Param: "", Summary: `unknown component type "nope"`},
		}},
		{name: "component does not implement its kind", typ: "liar", wantDiags: []Diagnostic{
			{Param: "", Summary: `type "liar": shared.notAScorer does not implement the scorer interface`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			role := tt.role
			if role == "" {
				role = RoleDecode
			}
			in, diags, err := rc.Configure(context.Background(), ConfigureRequest{
				Info: InstanceInfo{Name: "p/" + tt.name, Role: role, BlockSize: 16}, Type: tt.typ, Params: tt.params,
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
	_, _, err := rc.Configure(context.Background(), ConfigureRequest{Info: InstanceInfo{Name: "x"}, Type: "load", Params: Params{"scale": []int{1}}})
	var pe *ParamError
	if !errors.As(err, &pe) || pe.Param != "scale" {
		t.Fatalf("err = %v, want a *ParamError for scale", err)
	}
}

// randomCandidates returns 1..64 sorted rows with every column the test
// components read, and incoming costs half the time.
func randomCandidates(rng *rand.Rand) *Candidates {
	n := 1 + rng.IntN(64)
	c := &Candidates{
		IDs:            make([]WorkerID, n),
		ActiveRequests: make([]int64, n),
		Load:           make([]Load, n),
		OverlapBlocks:  make([]int32, n),
	}
	id := WorkerID(0)
	for i := range n {
		id += 1 + WorkerID(rng.IntN(3))
		c.IDs[i] = id
		c.ActiveRequests[i] = rng.Int64N(9)
		c.Load[i] = Load{Available: rng.IntN(4) != 0, ActiveDecodeBlocks: rng.Int64N(100), ActivePrefillTokens: rng.Int64N(4096), ActiveRequests: c.ActiveRequests[i]}
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

func cloneCandidates(c *Candidates) *Candidates {
	cl := func(s []int64) []int64 { return append([]int64(nil), s...) }
	out := &Candidates{
		IDs:            append([]WorkerID(nil), c.IDs...),
		ActiveRequests: cl(c.ActiveRequests),
		Load:           append([]Load(nil), c.Load...),
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
	comp   Component
	weight float64
}

// runLocal runs stages in order over a copy of c the way the host pipeline
// does and reports the answer the way a DecideResult does: kept rows and
// picked row as indices into c, costs as the stages' own weighted sum.
func runLocal(t *testing.T, req *Request, c *Candidates, stages []localStage) TaskResult {
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
		case Filter:
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
		case Scorer:
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
		case Picker:
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
	req := &Request{ID: "r1", Model: "m", Role: RoleAggregated, PromptTokens: 100, BlockSize: 16, BlockHashes: []uint64{1, 2, 3}}
	for iter := range 300 {
		max := rng.Int64N(9)
		scale := rng.Float64() * 3
		weight := rng.Float64() * 2
		configure(t, rc, "f", "max-active", Params{"max": max})
		configure(t, rc, "s", "load", Params{"scale": scale})
		configure(t, rc, "p", "lowest", nil)
		c := randomCandidates(rng)
		stages := []Stage{{Instance: "f", Kind: KindFilter}, {Instance: "s", Kind: KindScorer, Weight: weight}, {Instance: "p", Kind: KindPicker}}
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
	configure(t, rc, "none-left", "max-active", Params{"max": int64(0)})
	configure(t, rc, "p", "lowest", nil)
	c := &Candidates{IDs: []WorkerID{1, 2}, ActiveRequests: []int64{3, 5}}
	got, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c,
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
	c := &Candidates{IDs: []WorkerID{1, 2}, ActiveRequests: []int64{3, 1}}
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
			results[i], errs[i] = rc.Decide(context.Background(), &Task{Request: &Request{Model: model}, Candidates: c, Stages: stages})
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

// An instance's panics are logged with their stack the first time, then at
// most once per interval (an hour here), each answered with its error.
func TestPanicLogIsRateLimited(t *testing.T) {
	var logs strings.Builder
	s := newServer("v", testTypes(), hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Error}))
	if resp, _ := s.Configure(context.Background(), &pluginv1.ConfigureRequest{Instance: "boom", Type: "panicky"}); len(resp.Diagnostics) > 0 {
		t.Fatal(resp.Diagnostics)
	}
	inst := s.lookup("boom")
	inst.panicLog.Interval = time.Hour
	for i := range 5 {
		err := s.guard(inst, func() error { panic(fmt.Sprint("boom ", i)) })
		if want := fmt.Sprintf(`scorer "boom" panicked: boom %d`, i); err == nil || err.Error() != want || !panicMessage(err.Error()) {
			t.Errorf("panic %d: err = %v, want %s", i, err, want)
		}
	}
	if n := strings.Count(logs.String(), "component panicked"); n != 1 ||
		!strings.Contains(logs.String(), `panics=1 panic="boom 0"`) || !strings.Contains(logs.String(), "runtime/debug.Stack") {
		t.Errorf("%d panic lines, want the first with its stack only:\n%s", n, logs.String())
	}
}

// panicMessage tells the SDK's answer to a panic from a component's own
// error, whatever the error says.
func TestPanicMessage(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{`scorer "boom" panicked: boom`, true},
		{`filter "a b" panicked: runtime error: index out of range [3] with length 3`, true},
		{`picker "q\"x" panicked: nil`, true},
		{`scorer "boom": boom`, false},                   // a returned error
		{`scorer "boom": scorer "x" panicked: y`, false}, // one that quotes a panic
		{`classifier "c" panicked: x`, false},            // not a Decide stage
		{`scorer boom panicked: x`, false},               // the name unquoted
		{`scorer "unterminated panicked: x`, false},
		{`deadline passed before the task ran`, false},
	} {
		if got := panicMessage(c.msg); got != c.want {
			t.Errorf("panicMessage(%q) = %v, want %v", c.msg, got, c.want)
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
		{"unknown instance", &Task{Request: &Request{}, Candidates: &Candidates{IDs: []WorkerID{1}}, Stages: []Stage{{Instance: "ghost"}}},
			`unknown instance "ghost"`},
		{"picker not last", &Task{Request: &Request{}, Candidates: &Candidates{IDs: []WorkerID{1}, ActiveRequests: []int64{0}},
			Stages: []Stage{{Instance: "p"}, {Instance: "p"}}}, `picker "p" is not the task's last stage`},
		{"non-finite cost", &Task{Request: &Request{}, Candidates: &Candidates{IDs: []WorkerID{1}, ActiveRequests: []int64{1},
			Load: []Load{{}}, OverlapBlocks: []int32{0}, Costs: []float64{math.MaxFloat64}},
			Stages: []Stage{{Instance: "s", Weight: math.MaxFloat64}}}, "scorer s: cost 1 at row 0 overflows the weighted sum"},
		{"no rows", &Task{Request: &Request{}, Candidates: &Candidates{}, Stages: []Stage{{Instance: "p"}}}, "no workers"},
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

// TestServerTaskErrors drives the server directly with tasks a well-behaved
// client never sends.
func TestServerTaskErrors(t *testing.T) {
	s := newServer("v", testTypes(), nil)
	if resp, _ := s.Configure(context.Background(), &pluginv1.ConfigureRequest{Instance: "p", Type: "lowest"}); len(resp.Diagnostics) > 0 {
		t.Fatal(resp.Diagnostics)
	}
	tests := []struct {
		name string
		task *pluginv1.DecideTask
		want string
	}{
		{"deadline passed", &pluginv1.DecideTask{TaskId: 1, DeadlineUnixNano: time.Now().Add(-time.Millisecond).UnixNano(),
			Candidates: &pluginv1.Columns{Ids: []uint64{1}}, Stages: []*pluginv1.Stage{{Instance: "p"}}}, "deadline passed before the task ran"},
		{"bad column length", &pluginv1.DecideTask{TaskId: 2, Candidates: &pluginv1.Columns{Ids: []uint64{1, 2}, ActiveRequests: []int64{1}},
			Stages: []*pluginv1.Stage{{Instance: "p"}}}, "column active_requests has 1 entries for 2 rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.runTask(context.Background(), tt.task)
			if r.TaskId != tt.task.TaskId || !strings.Contains(r.Error, tt.want) || r.Picked != -1 {
				t.Fatalf("result %v, want error %q", r, tt.want)
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
	configure(t, rc, "held", "gated", Params{"gate": gate})
	configure(t, rc, "p", "lowest", nil)
	c := &Candidates{IDs: []WorkerID{1}, ActiveRequests: []int64{0}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "held"}}})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrPluginClosed) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	release()
	// The stream survives a caller's deadline.
	got, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}})
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
	configure(t, rc, "held", "gated", Params{"gate": gate})
	configure(t, rc, "p", "lowest", nil)
	c := &Candidates{IDs: []WorkerID{1}, ActiveRequests: []int64{0}}
	before := time.Now()
	if _, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "p"}}}); err != nil {
		t.Fatal(err)
	}
	answered := rc.LastAnswer()
	if answered.Before(before) || answered.After(time.Now()) {
		t.Fatalf("LastAnswer = %v, want within the call (from %v)", answered, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := rc.Decide(ctx, &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "held"}}}); !errors.Is(err, context.DeadlineExceeded) {
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

func TestDecideConcurrentCallsBatch(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "f", "max-active", Params{"max": int64(6)})
	configure(t, rc, "s", "load", nil)
	configure(t, rc, "p", "lowest", nil)
	// Hold the first Send a moment so the other callers queue behind it.
	var once sync.Once
	rc.testHookBeforeSend = func(int) { once.Do(func() { time.Sleep(30 * time.Millisecond) }) }
	const callers = 64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			c := randomCandidates(rng)
			c.Costs = nil
			stages := []Stage{{Instance: "f"}, {Instance: "s", Weight: 1}, {Instance: "p"}}
			got, err := rc.Decide(context.Background(), &Task{Request: &Request{ID: "r"}, Candidates: c, Stages: stages})
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
				return
			}
			want := runLocal(t, &Request{ID: "r"}, c, []localStage{
				{name: "f", comp: &maxActiveFilter{max: 6}}, {name: "s", comp: &loadScorer{scale: 1}, weight: 1}, {name: "p", comp: lowestPicker{}},
			})
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("caller %d (-want +got):\n%s", i, diff)
			}
		}()
	}
	wg.Wait()
	if rc.sentTasks.Load() != callers {
		t.Errorf("sent %d tasks, want %d", rc.sentTasks.Load(), callers)
	}
	if rc.maxBatch.Load() < 2 {
		t.Errorf("largest batch had %d tasks; queued callers must share a DecideBatch", rc.maxBatch.Load())
	}
	t.Logf("%d tasks in %d batches (largest %d)", rc.sentTasks.Load(), rc.batches.Load(), rc.maxBatch.Load())
}

func TestClientClose(t *testing.T) {
	rc := newTestClient(t)
	configure(t, rc, "slow", "sleepy", Params{"sleep": 10 * time.Second})
	c := &Candidates{IDs: []WorkerID{1}}
	errc := make(chan error, 1)
	go func() {
		_, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}})
		errc <- err
	}()
	for rc.sentTasks.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrPluginClosed) {
			t.Fatalf("in-flight call: err = %v, want ErrPluginClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("in-flight call did not fail after Close")
	}
	if _, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c}); !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("Decide after Close: err = %v, want ErrPluginClosed", err)
	}
	if _, err := rc.Describe(context.Background()); !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("Describe after Close: err = %v, want ErrPluginClosed", err)
	}
}

func TestStreamBreakFailsPendingAndReopens(t *testing.T) {
	ps := map[string]plugin.Plugin{PluginSetKey: &GRPCPlugin{Version: "v", Types: testTypes()}}
	client, server := plugin.TestPluginGRPCConn(t, false, ps)
	defer func() { _ = client.Close() }()
	raw, err := client.Dispense(PluginSetKey)
	if err != nil {
		t.Fatal(err)
	}
	rc := raw.(*RemoteClient)
	defer func() { _ = rc.Close() }()
	configure(t, rc, "slow", "sleepy", Params{"sleep": 10 * time.Second})
	c := &Candidates{IDs: []WorkerID{1}}
	errc := make(chan error, 1)
	go func() {
		_, err := rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}})
		errc <- err
	}()
	for rc.sentTasks.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
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
	_, err = rc.Decide(context.Background(), &Task{Request: &Request{}, Candidates: c, Stages: []Stage{{Instance: "slow"}}})
	if !errors.Is(err, ErrPluginClosed) {
		t.Fatalf("call after the plugin died: err = %v, want ErrPluginClosed", err)
	}
}

func TestValidateTypes(t *testing.T) {
	newOK := func(InstanceInfo, Params) (Component, error) { return lowestPicker{}, nil }
	tests := []struct {
		name  string
		types []TypeInfo
		want  string
	}{
		{"ok", testTypes(), ""},
		{"no types", nil, "no component types"},
		{"duplicate", []TypeInfo{{Name: "a", Kind: KindPicker, New: newOK}, {Name: "a", Kind: KindPicker, New: newOK}}, `type "a" is defined twice`},
		{"nil New", []TypeInfo{{Name: "a", Kind: KindPicker}}, `type "a" has a nil New`},
		{"bad kind", []TypeInfo{{Name: "a", New: newOK}}, `type "a" has invalid kind 0`},
		{"classifier", []TypeInfo{{Name: "a", Kind: KindClassifier, New: newOK}}, ""},
		{"default of the wrong type", []TypeInfo{{Name: "a", Kind: KindPicker, New: newOK,
			Params: []ParamSpec{{Name: "n", Type: Int, Default: 1.5}}}}, `parameter "n" default: got a number value, want int`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateTypes(tt.types)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestWatchParentExitsWhenParentChanges(t *testing.T) {
	exited := make(chan struct{})
	go watchParent(-1, time.Millisecond, func(int, int) { close(exited) })
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("watchParent did not notice a changed parent")
	}
}
