package shared

import (
	"hash/fnv"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCompactKeepsOrderInEveryColumn(t *testing.T) {
	c := &Candidates{
		IDs:              []WorkerID{1, 2, 3, 4},
		ActiveRequests:   []int64{10, 20, 30, 40},
		Load:             []Load{{ActiveRequests: 1}, {ActiveRequests: 2}, {ActiveRequests: 3}, {ActiveRequests: 4}},
		OverlapBlocks:    []int32{5, 6, 7, 8},
		CPUOverlapBlocks: []int32{13, 14, 15, 16},
		TotalKVBlocks:    []int64{9, 10, 11, 12},
		Costs:            []float64{0.1, 0.2, 0.3, 0.4},
		Names:            []string{"a", "b", "c", "d"},
		Labels:           []Labels{{{"k", "1"}}, {{"k", "2"}}, nil, {{"k", "4"}}},
	}
	if n := c.Compact([]bool{false, true, false, true}); n != 2 {
		t.Fatalf("Compact = %d, want 2", n)
	}
	want := &Candidates{
		IDs:              []WorkerID{2, 4},
		ActiveRequests:   []int64{20, 40},
		Load:             []Load{{ActiveRequests: 2}, {ActiveRequests: 4}},
		OverlapBlocks:    []int32{6, 8},
		CPUOverlapBlocks: []int32{14, 16},
		TotalKVBlocks:    []int64{10, 12},
		Costs:            []float64{0.2, 0.4},
		Names:            []string{"b", "d"},
		Labels:           []Labels{{{"k", "2"}}, {{"k", "4"}}},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("after Compact (-want +got):\n%s", diff)
	}
	if c.DPRanks != nil {
		t.Fatal("a nil column must stay nil")
	}
}

func TestSorted(t *testing.T) {
	tests := []struct {
		name  string
		c     Candidates
		wants bool
	}{
		{"ascending", Candidates{IDs: []WorkerID{1, 2, 5}}, true},
		{"empty", Candidates{}, true},
		{"duplicate id", Candidates{IDs: []WorkerID{1, 1}}, false},
		{"descending", Candidates{IDs: []WorkerID{2, 1}}, false},
		{"same id, ascending ranks", Candidates{IDs: []WorkerID{1, 1}, DPRanks: []uint32{0, 1}}, true},
		{"same id, same rank", Candidates{IDs: []WorkerID{1, 1}, DPRanks: []uint32{1, 1}}, false},
	}
	for _, tt := range tests {
		if got := tt.c.Sorted(); got != tt.wants {
			t.Errorf("%s: Sorted = %v, want %v", tt.name, got, tt.wants)
		}
	}
}

func TestInputs(t *testing.T) {
	if got := (InputOccupancy | InputCache).Normalize(); got != InputActiveRequests|InputCache {
		t.Errorf("Normalize folds OCCUPANCY: got %v", got)
	}
	if got := (InputLoad | 1<<20).Normalize(); got != InputLoad {
		t.Errorf("Normalize drops unknown bits: got %v", got)
	}
	if got := (InputActiveRequests | InputCapacity).String(); got != "ACTIVE_REQUESTS|CAPACITY" {
		t.Errorf("String = %q", got)
	}
	if got := Inputs(0).String(); got != "none" {
		t.Errorf("String(0) = %q", got)
	}
	for _, name := range []string{"ACTIVE_REQUESTS", "OCCUPANCY", "LOAD", "CACHE", "CAPACITY"} {
		in, ok := ParseInput(name)
		if !ok || in.String() != name {
			t.Errorf("ParseInput(%q) = %v, %v", name, in, ok)
		}
	}
	if _, ok := ParseInput("active_requests"); ok {
		t.Error("input names are case-sensitive")
	}
}

func TestParamsAndDefaults(t *testing.T) {
	ti := TypeInfo{Params: []ParamSpec{
		{Name: "t", Type: Number, Default: 0.5},
		{Name: "n", Type: Int, Default: int64(3)},
		{Name: "d", Type: Duration, Default: 20 * time.Millisecond},
		{Name: "opt", Type: String},
	}}
	p := ti.WithDefaults(Params{"n": int64(7), "b": true})
	if p.Float("t", -1) != 0.5 || p.Int("n", -1) != 7 || p.Duration("d", 0) != 20*time.Millisecond ||
		!p.Bool("b", false) || p.String("opt", "none") != "none" || p.Has("opt") {
		t.Fatalf("params %v", p)
	}
	if p.Float("n", -1) != 7 {
		t.Error("Float reads an Int parameter")
	}
	if _, ok := ti.Param("d"); !ok {
		t.Error("Param(d) not found")
	}
	for _, v := range []float64{-1, math.NaN(), math.Inf(1)} {
		if err := NonNegative("x", v); err == nil {
			t.Errorf("NonNegative(%v) accepted", v)
		}
	}
	if err := NonNegative("x", 0); err != nil {
		t.Errorf("NonNegative(0): %v", err)
	}
}

func TestKindAndRole(t *testing.T) {
	if KindScorer.String() != "scorer" || Kind(0).String() != "unknown" {
		t.Error("Kind.String")
	}
	if !RoleDecode.Valid() || Role("both").Valid() {
		t.Error("Role.Valid")
	}
}

// TestWorkerIDOf pins the id scheme against hash/fnv's FNV-1a 64 and
// against values computed independently (Python, the formula in the doc).
func TestWorkerIDOf(t *testing.T) {
	for name, want := range map[string]uint64{
		"":          14695981039346656037,
		"a":         12638187200555641996,
		"sim-3":     1266439823738918328,
		"gpu-0":     2241005059874422408,
		"prefill-0": 11000958765194345318,
	} {
		if got := WorkerIDOf(name); uint64(got) != want {
			t.Errorf("WorkerIDOf(%q) = %d, want %d", name, got, want)
		}
		h := fnv.New64a()
		h.Write([]byte(name))
		if got := WorkerIDOf(name); uint64(got) != h.Sum64() {
			t.Errorf("WorkerIDOf(%q) = %d, hash/fnv says %d", name, got, h.Sum64())
		}
	}
	// Non-ASCII names hash their UTF-8 bytes.
	h := fnv.New64a()
	h.Write([]byte("wörker-é"))
	if got := WorkerIDOf("wörker-é"); uint64(got) != h.Sum64() {
		t.Errorf("WorkerIDOf(non-ASCII) = %d, want %d", got, h.Sum64())
	}
}

func TestWorkerLabels(t *testing.T) {
	own := map[string]string{"zone": "eu", "switchyard.io/role": "spoofed", "gpu": "h100"}
	got := WorkerLabels(own, RoleDecode, []string{"llama", "", "gemma", "llama"}, true, 3)
	want := Labels{{"gpu", "h100"}, {LabelDPRank, "3"}, {LabelModel, "gemma,llama"}, {LabelRole, "decode"}, {"zone", "eu"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("WorkerLabels (-want +got):\n%s", diff)
	}
	if !got.Sorted() {
		t.Error("not sorted")
	}
	if v, ok := got.Get(LabelRole); !ok || v != "decode" {
		t.Errorf("Get(role) = %q, %v; the router's key wins over the worker's", v, ok)
	}
	if _, ok := got.Get("rack"); ok {
		t.Error("Get(rack) found a label never set")
	}
	// No models, not data-parallel: neither key.
	if diff := cmp.Diff(Labels{{LabelRole, "aggregated"}}, WorkerLabels(nil, RoleAggregated, nil, false, 0)); diff != "" {
		t.Errorf("bare worker (-want +got):\n%s", diff)
	}
	if (Labels{{"b", ""}, {"a", ""}}).Sorted() || (Labels{{"a", ""}, {"a", ""}}).Sorted() {
		t.Error("Sorted accepts unsorted or repeated keys")
	}
	if diff := cmp.Diff(map[string]string{"gpu": "h100", LabelDPRank: "3", LabelModel: "gemma,llama", LabelRole: "decode", "zone": "eu"}, got.Map()); diff != "" {
		t.Errorf("Map (-want +got):\n%s", diff)
	}
}

func TestListParams(t *testing.T) {
	p := Params{"prefer": []string{"a", "b"}, "weights": []float64{0.5, 2}, "name": "x"}
	if got := p.Strings("prefer", nil); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Strings(prefer) = %v", got)
	}
	if got := p.Strings("name", []string{"def"}); !slices.Equal(got, []string{"def"}) {
		t.Errorf("Strings(a string param) = %v, want the default", got)
	}
	if got := p.Floats("weights", nil); !slices.Equal(got, []float64{0.5, 2}) {
		t.Errorf("Floats(weights) = %v", got)
	}
	if got := p.Floats("absent", nil); got != nil {
		t.Errorf("Floats(absent) = %v, want nil", got)
	}
	if StringList.String() != "list(string)" || NumberList.String() != "list(number)" {
		t.Errorf("names %q, %q", StringList.String(), NumberList.String())
	}
}

func TestNoHeadroomErrorMessage(t *testing.T) {
	for _, c := range []struct {
		e    NoHeadroomError
		want string
	}{
		{NoHeadroomError{RetryAfter: time.Second, TTFT: 0.5, TPOT: 0.031},
			"no worker is predicted to meet the request's latency targets (best: TTFT 500 ms, TPOT 31.0 ms); retry after 1s"},
		{NoHeadroomError{RetryAfter: time.Second, TTFT: 0.5, TPOT: 0.031, TTFTLeft: 0.2, HasTTFTLeft: true},
			"no worker is predicted to meet the request's latency targets (best: TTFT 500 ms, TPOT 31.0 ms against 200 ms left of the TTFT target); retry after 1s"},
		{NoHeadroomError{RetryAfter: time.Second, TTFTLeft: -0.01, HasTTFTLeft: true},
			"no worker is predicted to meet the request's latency targets (best: TTFT 0 ms, TPOT 0.0 ms against a TTFT target its time in the router already used up); retry after 1s"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("got %q\nwant %q", got, c.want)
		}
	}
}
