package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/hosted"
	"github.com/switchyard-router/switchyard/shared"
)

func TestLeastLoaded(t *testing.T) {
	tests := []struct {
		name   string
		counts []int64
		want   []int // every row that may be picked
	}{
		{"one", []int64{9}, []int{0}},
		{"unique minimum first", []int64{0, 4, 2}, []int{0}},
		{"unique minimum last", []int64{5, 4, 3}, []int{2}},
		{"ties", []int64{3, 1, 7, 1, 1}, []int{1, 3, 4}},
		{"all equal", []int64{2, 2, 2}, []int{0, 1, 2}},
	}
	l := NewLeastLoaded(seeded(1))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := idsN(len(tt.counts))
			c := &shared.Candidates{IDs: ids, ActiveRequests: tt.counts}
			seen := map[int]int{}
			for range 3000 {
				hr, err := pickHosted(l, ids, tt.counts)
				if err != nil {
					t.Fatal(err)
				}
				fr, err := l.Pick(context.Background(), nil, c)
				if err != nil {
					t.Fatal(err)
				}
				seen[hr]++
				seen[fr]++
			}
			var rows []int
			for row, n := range seen {
				rows = append(rows, row)
				// 6000 picks over k tied rows: each within 15% of 6000/k.
				if want := 6000 / len(tt.want); n < want*85/100 || n > want*115/100 {
					t.Errorf("row %d picked %d times, want %d ± 15%%", row, n, want)
				}
			}
			if diff := cmp.Diff(tt.want, rows, cmpSorted); diff != "" {
				t.Errorf("rows picked (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLeastLoadedErrors(t *testing.T) {
	l := NewLeastLoaded(nil)
	if _, err := l.Pick(context.Background(), nil, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Pick on empty: %v, want ErrNoWorkers", err)
	}
	if _, err := l.Pick(context.Background(), nil, &shared.Candidates{IDs: idsN(2)}); !errors.Is(err, hosted.ErrNoActiveRequests) {
		t.Errorf("Pick without column: %v, want ErrNoActiveRequests", err)
	}
	if _, err := pickHosted(l, idsN(2), nil); !errors.Is(err, hosted.ErrNoActiveRequests) {
		t.Errorf("Select without accessor: %v, want ErrNoActiveRequests", err)
	}
	if _, err := pickHosted(l, nil, []int64{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("Select on empty: %v, want ErrNoWorkers", err)
	}
}
