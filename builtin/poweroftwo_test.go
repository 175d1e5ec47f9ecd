package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

func TestPowerOfTwoSingle(t *testing.T) {
	p := NewPowerOfTwo(seeded(1))
	reads := 0
	v := hosted.NewWorkerInputView(idsN(1), 0, func(int) int64 { reads++; return 5 }, 16)
	for range 100 {
		if row, err := hosted.Select(p, &v); err != nil || row != 0 {
			t.Fatalf("Select over one worker = %d, %v; want 0, nil", row, err)
		}
	}
	if reads != 0 {
		t.Errorf("one worker: accessor read %d times, want 0 (returned directly)", reads)
	}
	if row, err := p.Pick(context.Background(), nil, &shared.Candidates{IDs: idsN(1)}); err != nil || row != 0 {
		t.Errorf("Pick over one worker = %d, %v; want 0, nil", row, err)
	}
}

// TestPowerOfTwoDistinctDraws records the rows each pick reads: exactly two,
// never the same one twice, and the result is the less loaded of the two
// (the first on a tie).
func TestPowerOfTwoDistinctDraws(t *testing.T) {
	p := NewPowerOfTwo(seeded(7))
	for _, n := range []int{2, 3, 10} {
		ids := idsN(n)
		counts := make([]int64, n)
		for i := range counts {
			counts[i] = int64(i % 3) // ties among rows
		}
		pairs := map[[2]int]bool{}
		for range 2000 {
			var read []int
			v := hosted.NewWorkerInputView(ids, 0, func(row int) int64 { read = append(read, row); return counts[row] }, 16)
			row, err := hosted.Select(p, &v)
			if err != nil {
				t.Fatal(err)
			}
			if len(read) != 2 || read[0] == read[1] {
				t.Fatalf("n=%d: rows read %v, want two distinct", n, read)
			}
			a, b := read[0], read[1]
			want := a
			if counts[b] < counts[a] {
				want = b
			}
			if row != want {
				t.Fatalf("n=%d: read %v with counts %d, %d: picked %d, want %d", n, read, counts[a], counts[b], row, want)
			}
			pairs[[2]int{a, b}] = true
		}
		// Every ordered pair of distinct rows occurs (n(n-1) <= 90 pairs in 2000 draws).
		if len(pairs) != n*(n-1) {
			t.Errorf("n=%d: %d ordered pairs drawn, want %d", n, len(pairs), n*(n-1))
		}
	}
}

func TestPowerOfTwoPick(t *testing.T) {
	p := NewPowerOfTwo(seeded(2))
	c := &shared.Candidates{IDs: idsN(2), ActiveRequests: []int64{9, 1}}
	for range 200 {
		if row, err := p.Pick(context.Background(), nil, c); err != nil || row != 1 {
			t.Fatalf("Pick over two = %d, %v; want the less loaded row 1", row, err)
		}
	}
	if _, err := p.Pick(context.Background(), nil, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Pick on empty: %v, want ErrNoWorkers", err)
	}
	if _, err := p.Pick(context.Background(), nil, &shared.Candidates{IDs: idsN(2)}); !errors.Is(err, hosted.ErrNoActiveRequests) {
		t.Errorf("Pick without column: %v, want ErrNoActiveRequests", err)
	}
	var v hosted.WorkerInputView
	if _, err := p.PickHosted(&v); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("PickHosted on empty: %v, want ErrNoWorkers", err)
	}
}
