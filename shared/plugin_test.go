package shared

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
	// 4 LOAD, 8 CACHE, 16 CAPACITY.
	inputs := map[Inputs]uint32{InputActiveRequests: 1, InputOccupancy: 2, InputLoad: 4, InputCache: 8, InputCapacity: 16}
	for in, bit := range inputs {
		if inputsToProto(in) != bit {
			t.Errorf("input %v: wire bit %d, want %d", in, inputsToProto(in), bit)
		}
	}
	if AllInputs != 31 {
		t.Errorf("AllInputs = %d; a new input needs a wire bit and this test", AllInputs)
	}
	kinds := map[Kind]pluginv1.Kind{KindFilter: pluginv1.Kind_KIND_FILTER, KindScorer: pluginv1.Kind_KIND_SCORER,
		KindPicker: pluginv1.Kind_KIND_PICKER, KindClassifier: pluginv1.Kind_KIND_CLASSIFIER}
	for k, pk := range kinds {
		if kindToProto(k) != pk {
			t.Errorf("kind %v -> %v, want %v", k, kindToProto(k), pk)
		}
	}
	types := map[ParamType]pluginv1.ParamType{Number: pluginv1.ParamType_PARAM_TYPE_NUMBER, Int: pluginv1.ParamType_PARAM_TYPE_INT,
		Bool: pluginv1.ParamType_PARAM_TYPE_BOOL, String: pluginv1.ParamType_PARAM_TYPE_STRING, Duration: pluginv1.ParamType_PARAM_TYPE_DURATION}
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
