package plugincheck

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/shared"
)

// The answers the Go SDK never sends (it refuses them in the plugin) are
// checked too, for plugins written without it: fake components stand in
// for the plugin's instances.
type nanScorer struct{}

func (nanScorer) Inputs() shared.Inputs { return 0 }
func (nanScorer) Score(_ context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	costs[c.Len()-1] = math.NaN()
	return nil
}

type rowPicker struct{ row int }

func (rowPicker) Inputs() shared.Inputs { return 0 }
func (p rowPicker) Pick(context.Context, *shared.Request, *shared.Candidates) (int, error) {
	return p.row, nil
}

type idFilter struct {
	mu  sync.Mutex
	ids []shared.WorkerID
}

func (*idFilter) Inputs() shared.Inputs { return 0 }
func (f *idFilter) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	f.mu.Lock()
	f.ids = append(f.ids, c.IDs...)
	f.mu.Unlock()
	if c.Len() == 8 {
		return errors.New("kept rows not ascending")
	}
	return nil
}

func TestCheckDecideAnswers(t *testing.T) {
	ctx := context.Background()
	got := checkDecide(ctx, shared.TypeInfo{Name: "nan", Kind: shared.KindScorer}, nanScorer{}, shared.RoleAggregated)
	if want := (Result{Name: `decide "nan" rows=4096`, Expected: "finite costs", Got: "cost NaN for row 4095"}); len(got) != 4 || got[2] != want {
		t.Errorf("NaN scorer: %+v, want 4 results, the third %+v", got, want)
	}
	if want := (Result{Name: `decide "nan" concurrent=32`, Expected: "finite costs for the call of 1 rows", Got: "cost NaN for row 0"}); got[3] != want {
		t.Errorf("NaN scorer, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 1}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" rows=1`, Expected: "a picked row in [0, 1)", Got: "1"}); len(got) != 4 || got[0] != want || !got[1].Pass || !got[2].Pass {
		t.Errorf("picker of row 1: %+v, want %+v then two passes", got, want)
	}
	if want := (Result{Name: `decide "p" concurrent=32`, Expected: "a picked row in [0, 1) for the call of 1 rows", Got: "1"}); got[3] != want {
		t.Errorf("picker of row 1, concurrent: %+v, want %+v", got[3], want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: 0}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" concurrent=32`, Pass: true, Note: "calls of 1 to 32 rows at once"}); len(got) != 4 || got[3] != want {
		t.Errorf("picker of row 0: %+v, want the last %+v", got, want)
	}
	got = checkDecide(ctx, shared.TypeInfo{Name: "p", Kind: shared.KindPicker}, rowPicker{row: -1}, shared.RoleAggregated)
	if want := (Result{Name: `decide "p" rows=8`, Expected: "a picked row in [0, 8)", Got: "-1"}); got[1] != want {
		t.Errorf("picker of row -1: %+v, want %+v", got, want)
	}
	f := &idFilter{}
	got = checkDecide(ctx, shared.TypeInfo{Name: "f", Kind: shared.KindFilter}, f, shared.RoleAggregated)
	if want := (Result{Name: `decide "f" rows=8`, Expected: "a well-formed answer", Got: "kept rows not ascending"}); got[1] != want || !got[0].Pass || !got[2].Pass {
		t.Errorf("filter: %+v, want the rows=8 failure %+v", got, want)
	}
	if want := (Result{Name: `decide "f" concurrent=32`, Expected: "a well-formed answer for the call of 8 rows", Got: "kept rows not ascending"}); got[3] != want {
		t.Errorf("filter, concurrent: %+v, want %+v", got[3], want)
	}
	if want := 1 + 8 + 4096 + 32*33/2; len(f.ids) != want {
		t.Fatalf("filter saw %d rows, want %d", len(f.ids), want)
	}
	for i, id := range f.ids {
		if uint64(id) <= 1<<53 {
			t.Fatalf("row %d: id %d not above 2^53", i, id)
		}
	}
}

func TestCheckSchemaDefaults(t *testing.T) {
	got := checkSchema([]shared.TypeInfo{{Name: "t", Doc: "d", Params: []shared.ParamSpec{
		{Name: "n", Type: shared.Number, Default: 1.5, Doc: "ok"},
		{Name: "d", Type: shared.Duration, Default: int64(5), Doc: "int, not a duration"},
		{Name: "9lives", Type: shared.Bool, Default: time.Second, Doc: "bad name, bad default"},
	}}, {Name: "t", Doc: "again"}})
	want := []Result{
		{Name: `schema type "t" parameter "d"`, Expected: "a default of the declared type duration", Got: "int64 5"},
		{Name: `schema type "t" parameter "9lives"`, Expected: "a name of letters, digits, '_' and '-', not starting with a digit", Got: `"9lives"`},
		{Name: `schema type "t" parameter "9lives"`, Expected: "a default of the declared type bool", Got: "time.Duration 1s"},
		{Name: `schema type "t"`, Expected: "type names unique", Got: "a second type of that name"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := checkSchema([]shared.TypeInfo{{Name: "ok-type_1", Doc: "d"}}); len(got) != 1 || !got[0].Pass {
		t.Errorf("a valid schema: %+v", got)
	}
}
