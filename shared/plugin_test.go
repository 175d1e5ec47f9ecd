package shared

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestWireNumberingMatchesSDK: the plugin side's enums are the wire's (the
// router's side checks its own direction in internal/pluginclient).
func TestWireNumberingMatchesSDK(t *testing.T) {
	// The ComponentType.inputs comment: 1 ACTIVE_REQUESTS, 2 OCCUPANCY,
	// 4 LOAD, 8 CACHE, 16 CAPACITY, 32 LABELS.
	inputs := map[Inputs]uint32{InputActiveRequests: 1, InputOccupancy: 2, InputLoad: 4, InputCache: 8, InputCapacity: 16, InputLabels: 32}
	for in, bit := range inputs {
		if inputsToProto(in) != bit {
			t.Errorf("input %v: wire bit %d, want %d", in, inputsToProto(in), bit)
		}
	}
	if PluginInputs != 63 {
		t.Errorf("PluginInputs = %d; a new input needs a wire bit and this test", PluginInputs)
	}
	if got := inputsToProto(InputLatency | InputLoad); got != 4 {
		t.Errorf("LATENCY|LOAD on the wire = %d, want 4: LATENCY is in-process only", got)
	}
	kinds := map[Kind]pluginv1.Kind{KindFilter: pluginv1.Kind_KIND_FILTER, KindScorer: pluginv1.Kind_KIND_SCORER,
		KindPicker: pluginv1.Kind_KIND_PICKER, KindClassifier: pluginv1.Kind_KIND_CLASSIFIER}
	for k, pk := range kinds {
		if kindToProto(k) != pk {
			t.Errorf("kind %v -> %v, want %v", k, kindToProto(k), pk)
		}
	}
	types := map[ParamType]pluginv1.ParamType{Number: pluginv1.ParamType_PARAM_TYPE_NUMBER, Int: pluginv1.ParamType_PARAM_TYPE_INT,
		Bool: pluginv1.ParamType_PARAM_TYPE_BOOL, String: pluginv1.ParamType_PARAM_TYPE_STRING, Duration: pluginv1.ParamType_PARAM_TYPE_DURATION,
		StringList: pluginv1.ParamType_PARAM_TYPE_STRING_LIST, NumberList: pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST}
	for pt, wt := range types {
		if paramTypeToProto(pt) != wt {
			t.Errorf("param type %v -> %v, want %v", pt, paramTypeToProto(pt), wt)
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
		{"short names", &pluginv1.Columns{Ids: []uint64{1, 2}, Names: []string{"a"}}, "column names has 1 entries for 2 rows"},
		{"counts over refs", &pluginv1.Columns{Ids: []uint64{1, 2}, LabelCounts: []uint32{1, 2}, LabelRefs: []uint32{0, 1, 0, 1}, LabelStrings: []string{"a", "x"}},
			"label_counts add up to more than the 2 labels of label_refs"},
		{"refs over counts", &pluginv1.Columns{Ids: []uint64{1}, LabelCounts: []uint32{1}, LabelRefs: []uint32{0, 1, 0, 1}, LabelStrings: []string{"a", "x"}},
			"label_counts add up to 1 labels, label_refs has 2"},
		{"huge count", &pluginv1.Columns{Ids: []uint64{1}, LabelCounts: []uint32{4294967295}, LabelRefs: []uint32{0, 0}, LabelStrings: []string{"a"}},
			"label_counts add up to more than the 1 labels of label_refs"},
		{"odd refs", &pluginv1.Columns{Ids: []uint64{1}, LabelCounts: []uint32{1}, LabelRefs: []uint32{0}, LabelStrings: []string{"a"}}, "label_refs has 1 entries, not a key and a value"},
		{"ref out of range", &pluginv1.Columns{Ids: []uint64{1}, LabelCounts: []uint32{1}, LabelRefs: []uint32{0, 4294967295}, LabelStrings: []string{"a"}},
			"label_refs entry 0 refers to string 4294967295 of 1 label_strings"},
		{"refs without counts", &pluginv1.Columns{Ids: []uint64{1}, LabelRefs: []uint32{0, 0}, LabelStrings: []string{"a"}}, "without label_counts"},
		{"short counts", &pluginv1.Columns{Ids: []uint64{1, 2}, LabelCounts: []uint32{0}}, "column label_counts has 1 entries for 2 rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := candidatesFromProto(tt.cols, &Candidates{}, new([]Label))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// Names and labels decode into per-row Labels over one storage, reused
// from task to task; without them both columns are nil.
func TestCandidatesFromProtoLabels(t *testing.T) {
	// label_strings: 0 rack, 1 r1, 2 zone, 3 eu, 4 us.
	cols := &pluginv1.Columns{Ids: []uint64{1, 2, 3}, Names: []string{"a", "b", "c"},
		LabelCounts: []uint32{2, 0, 1}, LabelRefs: []uint32{0, 1, 2, 3, 2, 4}, LabelStrings: []string{"rack", "r1", "zone", "eu", "us"}}
	var c Candidates
	var store []Label
	if err := candidatesFromProto(cols, &c, &store); err != nil {
		t.Fatal(err)
	}
	want := Candidates{IDs: []WorkerID{1, 2, 3}, Names: []string{"a", "b", "c"},
		Labels: []Labels{{{"rack", "r1"}, {"zone", "eu"}}, {}, {{"zone", "us"}}}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("candidates (-want +got):\n%s", diff)
	}
	if v, ok := c.Labels[0].Get("zone"); !ok || v != "eu" {
		t.Errorf("row 0 zone = %q, %v", v, ok)
	}
	if _, ok := c.Labels[1].Get("zone"); ok {
		t.Error("row 1 has a zone")
	}
	// A row's labels cannot grow into the next row's.
	if cap(c.Labels[0]) != 2 {
		t.Errorf("row 0 labels have capacity %d, want 2", cap(c.Labels[0]))
	}
	if err := candidatesFromProto(&pluginv1.Columns{Ids: []uint64{7}}, &c, &store); err != nil {
		t.Fatal(err)
	}
	if c.Names != nil || c.Labels != nil {
		t.Errorf("without LABELS: names %v labels %v, want nil", c.Names, c.Labels)
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
		if want := fmt.Sprintf(`scorer "boom" panicked: boom %d`, i); err == nil || err.Error() != want || !pluginwire.IsPanicMessage(err.Error(), "scorer") {
			t.Errorf("panic %d: err = %v, want %s", i, err, want)
		}
	}
	if n := strings.Count(logs.String(), "component panicked"); n != 1 ||
		!strings.Contains(logs.String(), `panics=1 panic="boom 0"`) || !strings.Contains(logs.String(), "runtime/debug.Stack") {
		t.Errorf("%d panic lines, want the first with its stack only:\n%s", n, logs.String())
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
