package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

// TestRandomUniform: each of 5 rows is drawn within 5% of 1/5 over 100000
// draws (the binomial standard deviation is about 0.6% of the mean).
func TestRandomUniform(t *testing.T) {
	const n, draws = 5, 100000
	r := NewRandom(seeded(3))
	ids := idsN(n)
	counts := make([]int, n)
	for range draws {
		row, err := pickHosted(r, ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		counts[row]++
	}
	for row, c := range counts {
		if want := draws / n; c < want*95/100 || c > want*105/100 {
			t.Errorf("row %d drawn %d times, want %d ± 5%%", row, c, want)
		}
	}
}

func TestRandomSeedRepeats(t *testing.T) {
	c := &shared.Candidates{IDs: idsN(10)}
	seq := func(p *Random) []int {
		var out []int
		for range 20 {
			row, err := p.Pick(context.Background(), nil, c)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, row)
		}
		return out
	}
	a, b := seq(NewRandom(seeded(42))), seq(NewRandom(seeded(42)))
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different draws (-first +second):\n%s", diff)
	}
	if cmp.Equal(a, seq(NewRandom(seeded(43)))) {
		t.Error("seeds 42 and 43 drew the same 20 rows")
	}
}

func TestRandomEmpty(t *testing.T) {
	r := NewRandom(nil)
	if _, err := r.Pick(context.Background(), nil, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Pick on empty: %v, want ErrNoWorkers", err)
	}
	var v hosted.WorkerInputView
	if _, err := r.PickHosted(&v); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("PickHosted on empty: %v, want ErrNoWorkers", err)
	}
}
