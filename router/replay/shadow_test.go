package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/shared"
)

// shadowed is round-robin live with the shadow SHADOW, among a second
// round-robin policy and a seeded random picker.
const shadowed = `
policy "rr" {
  picker "rr" { type = "round-robin" }
  shadow = "SHADOW"
}
policy "rr2" {
  picker "rr" { type = "round-robin" }
}
policy "rand" {
  picker "r" {
    type = "random"
    seed = 5
  }
}
worker_selection { aggregated = "rr" }
`

// outcomes decodes --per-request lines.
func outcomes(t *testing.T, b []byte) []Outcome {
	t.Helper()
	var out []Outcome
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var o Outcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// TestShadowReplay: a replay reports how its shadow agreed with the live
// decisions, and the live decisions are those of the same replay without
// a shadow, byte for byte apart from the shadow's fields.
func TestShadowReplay(t *testing.T) {
	const n, workers = 300, 4
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:n]
	var plain bytes.Buffer
	base := run(t, loadPolicy(t, roundRobin), "rr", recs, workers, &plain)
	if base.Shadow != nil {
		t.Fatalf("shadow report without a shadow: %+v", base.Shadow)
	}

	t.Run("twin", func(t *testing.T) {
		// A second round-robin instance agrees on every selection.
		var per bytes.Buffer
		rep := run(t, loadPolicy(t, strings.Replace(shadowed, "SHADOW", "rr2", 1)), "rr", recs, workers, &per)
		want := &report.ShadowReport{Shadows: map[string]string{"aggregated": "rr2"}, Decisions: n, Agree: n, AgreeShare: 1}
		if diff := cmp.Diff(want, rep.Shadow); diff != "" {
			t.Errorf("shadow report (-want +got):\n%s", diff)
		}
		for i, o := range outcomes(t, per.Bytes()) {
			if o.Shadow != "agree" || o.ShadowWorker == nil || *o.ShadowWorker != o.Worker {
				t.Fatalf("request %d: worker %d, shadow %q %v", i, o.Worker, o.Shadow, o.ShadowWorker)
			}
		}
	})

	t.Run("random", func(t *testing.T) {
		var per bytes.Buffer
		rep := run(t, loadPolicy(t, strings.Replace(shadowed, "SHADOW", "rand", 1)), "rr", recs, workers, &per)
		// The shadow draws as a random picker of seed 5 over the 4
		// workers, once per request in arrival order.
		r := builtin.NewRandom(shared.Params{builtin.ParamSeed: int64(5)})
		c := &shared.Candidates{IDs: make([]shared.WorkerID, workers)}
		order := indexesByID("sim-", 0, workers) // the candidate rows' workers
		var agree int64
		outs := outcomes(t, per.Bytes())
		for i, o := range outs {
			row, err := r.Pick(context.Background(), nil, c)
			if err != nil {
				t.Fatal(err)
			}
			if o.ShadowWorker == nil || *o.ShadowWorker != order[row] {
				t.Fatalf("request %d: shadow worker %v, want %d (row %d)", i, deref(o.ShadowWorker), order[row], row)
			}
			wantResult := "disagree"
			if order[row] == o.Worker {
				agree++
				wantResult = "agree"
			}
			if o.Shadow != wantResult {
				t.Fatalf("request %d: shadow %q, want %q", i, o.Shadow, wantResult)
			}
		}
		want := &report.ShadowReport{Shadows: map[string]string{"aggregated": "rand"}, Decisions: n, Agree: agree, Disagree: n - agree,
			AgreeShare: round4(float64(agree) / n)}
		if diff := cmp.Diff(want, rep.Shadow); diff != "" {
			t.Errorf("shadow report (-want +got):\n%s", diff)
		}
		if agree == 0 || agree == n {
			t.Errorf("a random shadow agreed %d of %d times", agree, n)
		}

		// The live side is the shadowless replay's, byte for byte, once
		// the shadow's two fields are taken out.
		var stripped bytes.Buffer
		for _, o := range outs {
			o.Shadow, o.ShadowWorker = "", nil
			b, err := json.Marshal(&o)
			if err != nil {
				t.Fatal(err)
			}
			stripped.Write(append(b, '\n'))
		}
		if !bytes.Equal(stripped.Bytes(), plain.Bytes()) {
			t.Error("per-request output with a shadow differs from the output without one")
		}
		same := *rep
		same.Shadow = nil
		same.WallS, same.DecisionsPerS, same.SimRequestsPerS = base.WallS, base.DecisionsPerS, base.SimRequestsPerS
		if diff := cmp.Diff(base, &same, cmp.AllowUnexported(report.Report{})); diff != "" {
			t.Errorf("report with a shadow (-without +with):\n%s", diff)
		}

		var table bytes.Buffer
		if err := report.WriteTable(&table, []*report.Report{base, rep}); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(table.String(), "\n")
		if !strings.Contains(lines[0], "shadow agree") || !strings.Contains(lines[2], fmt.Sprintf(" %.1f%%", 100*rep.Shadow.AgreeShare)) ||
			!strings.Contains(table.String(), "shadow agree = selections on which") {
			t.Errorf("table lacks the shadow column:\n%s", table.String())
		}
		if f := strings.Fields(lines[1]); f[14] != "-" {
			t.Errorf("the shadowless row's shadow cell is %q, want -:\n%s", f[14], table.String())
		}
	})

	t.Run("failed", func(t *testing.T) {
		b := loadPolicy(t, strings.Replace(shadowed, "SHADOW", "rr2", 1))
		b.Roles[shared.RoleAggregated].Shadow.Picker = failingPicker{err: errors.New("shadow down")}
		var per bytes.Buffer
		rep := run(t, b, "rr", recs, workers, &per)
		want := &report.ShadowReport{Shadows: map[string]string{"aggregated": "rr2"}, Decisions: n, Failed: n, FirstError: `picker "rr": shadow down`}
		if diff := cmp.Diff(want, rep.Shadow); diff != "" {
			t.Errorf("shadow report (-want +got):\n%s", diff)
		}
		if rep.Fallbacks != 0 || !bytes.Contains(per.Bytes(), []byte(`"shadow":"failed"`)) {
			t.Errorf("fallbacks %d; per-request lines lack the failed shadow", rep.Fallbacks)
		}
		var stderr bytes.Buffer
		if err := report.WriteShadowFailures(&stderr, rep); err != nil {
			t.Fatal(err)
		}
		wantLine := fmt.Sprintf("router: rr: shadow policy \"rr2\" (aggregated) failed %d of %d decisions (100.0%%); first error: picker \"rr\": shadow down\n", n, n)
		if stderr.String() != wantLine {
			t.Errorf("stderr %q, want %q", stderr.String(), wantLine)
		}
	})
}

// TestShadowReplayDisaggregated: each role's shadow is asked on its own
// hop's selections; the report counts both, per-request lines carry the
// prefill hop's.
func TestShadowReplayDisaggregated(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:200]
	b := loadPolicy(t, `
policy "rr" {
  picker "rr" { type = "round-robin" }
  shadow = "twin"
}
policy "twin" {
  picker "rr" { type = "round-robin" }
}
policy "dec" {
  picker "rr" { type = "round-robin" }
  shadow = "bad"
}
policy "bad" {
  picker "rr" { type = "round-robin" }
}
worker_selection {
  prefill = "rr"
  decode  = "dec"
}
`)
	b.Roles[shared.RoleDecode].Shadow.Picker = failingPicker{err: errors.New("shadow down")}
	var per bytes.Buffer
	rep, d := runDisagg(t, b, recs, 2, 2, 0, &per)
	checkBookingsReleased(t, d)
	var prefill, decode int64
	for _, o := range outcomes(t, per.Bytes()) {
		if o.Status != "ok" {
			continue
		}
		prefill++
		if o.DecodeWorker >= 0 {
			decode++
		}
		if o.Shadow != "agree" || o.ShadowWorker == nil || *o.ShadowWorker != o.Worker {
			t.Fatalf("request %d: worker %d, shadow %q %v", o.Index, o.Worker, o.Shadow, o.ShadowWorker)
		}
	}
	want := &report.ShadowReport{Shadows: map[string]string{"prefill": "twin", "decode": "bad"},
		Decisions: prefill + decode, Agree: prefill, Failed: decode, AgreeShare: round4(float64(prefill) / float64(prefill+decode)),
		FirstError: `picker "rr": shadow down`}
	if diff := cmp.Diff(want, rep.Shadow); diff != "" {
		t.Errorf("shadow report (-want +got):\n%s", diff)
	}
	if rep.Selections != prefill+decode || decode == 0 {
		t.Errorf("selections %d, prefill %d, decode %d", rep.Selections, prefill, decode)
	}
}

// indexesByID returns the indexes from..from+n-1 of simulated workers
// named prefix+index in ascending fleet id (shared.WorkerIDOf) order: the
// order of the candidate rows a policy sees.
func indexesByID(prefix string, from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	slices.SortFunc(out, func(a, b int) int {
		ia, ib := shared.WorkerIDOf(prefix+strconv.Itoa(a)), shared.WorkerIDOf(prefix+strconv.Itoa(b))
		if ia < ib {
			return -1
		}
		return 1
	})
	return out
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestIndexesByID(t *testing.T) {
	// WorkerIDOf: sim-3 0x11934c4f4f5dd5b8 < sim-2 < sim-1 0x11934e4f4f5dd91e < sim-0 0x11934f4f4f5ddad1.
	if got := indexesByID("sim-", 0, 4); !slices.Equal(got, []int{3, 2, 1, 0}) {
		t.Errorf("indexesByID(sim-, 0, 4) = %v, want [3 2 1 0]", got)
	}
}
