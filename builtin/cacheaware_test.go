package builtin

import (
	"context"
	"errors"
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

// sglangParams are SGLang's gateway defaults with its first-minimum ties.
func sglangParams() shared.Params {
	return shared.Params{ParamTies: TiesFirst}
}

// aibrixParams are AIBrix's prefix-cache defaults.
func aibrixParams(seed int64) shared.Params {
	return shared.Params{
		ParamCacheThreshold: 0.0, ParamBalanceAbs: 8.0, ParamBalanceRel: 0.0,
		ParamImbalanced: ImbalancedMatchLeastLoaded, ParamMatchTies: MatchTiesLeastLoaded,
		ParamStddevFactor: 1.0, ParamSeed: seed,
	}
}

func pickCA(t *testing.T, p shared.Params, counts []int64, overlap []int32) int {
	t.Helper()
	a, err := NewCacheAware(p)
	if err != nil {
		t.Fatal(err)
	}
	c := &shared.Candidates{IDs: idsN(len(counts)), ActiveRequests: counts, OverlapBlocks: overlap}
	row, err := a.Pick(context.Background(), &shared.Request{PromptTokens: 1000, BlockSize: 100}, c)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

func TestCacheAwareSGLang(t *testing.T) {
	// Prompt of 1000 tokens in blocks of 100: an overlap of k blocks is a
	// match of k/10.
	tests := []struct {
		name    string
		counts  []int64
		overlap []int32
		want    int
	}{
		{"best match over threshold wins whatever its load", []int64{5, 0, 3, 2}, []int32{4, 0, 2, 3}, 0},
		{"match equal to threshold is a miss: least loaded", []int64{5, 0, 3, 2}, []int32{3, 0, 2, 3}, 1},
		{"imbalanced (80 > 64, 100 > 1.5*20): least loaded", []int64{100, 20, 30, 36}, []int32{9, 0, 0, 0}, 1},
		{"spread 60 <= 64 is balanced", []int64{100, 40, 50, 60}, []int32{9, 0, 0, 0}, 0},
		{"spread 90 but 300 <= 1.5*210 is balanced", []int64{300, 210}, []int32{9, 0}, 0},
		{"miss: first of the least loaded", []int64{2, 1, 1}, []int32{0, 0, 0}, 1},
		{"equal best matches: first", []int64{4, 0, 4}, []int32{0, 6, 6}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pickCA(t, sglangParams(), tt.counts, tt.overlap); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCacheAwareAIBrix(t *testing.T) {
	tests := []struct {
		name    string
		counts  []int64
		overlap []int32
		want    []int // any of these
	}{
		// mean 3, sample stddev sqrt(14/3) = 2.16: bound 5.16. Row 3 (match
		// 0.8, 6 requests) is over it; rows 0 and 1 match 0.4, row 1 has
		// fewer requests.
		{"guard skips the best match; ties by fewer requests", []int64{3, 1, 2, 6}, []int32{4, 4, 2, 8}, []int{1}},
		// mean 3.25, stddev sqrt(6.75/3) = 1.5: bound 4.75.
		{"within the guard the best match wins", []int64{4, 1, 4, 4}, []int32{4, 4, 2, 8}, []int{3}},
		{"any held block is a match", []int64{0, 3}, []int32{0, 1}, []int{1}},
		// Spread 10 > 8: matching is restricted to rows 1 and 2 (2 requests).
		{"imbalanced: best match among the least loaded", []int64{12, 2, 2, 5}, []int32{8, 0, 3, 0}, []int{2}},
		{"imbalanced, no match there: least loaded", []int64{12, 2, 2, 5}, []int32{8, 0, 0, 0}, []int{1, 2}},
		{"spread 8 is balanced", []int64{10, 2, 6}, []int32{0, 0, 5}, []int{2}},
		{"no match: least loaded", []int64{3, 1, 2}, []int32{0, 0, 0}, []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pickCA(t, aibrixParams(7), tt.counts, tt.overlap)
			for _, w := range tt.want {
				if got == w {
					return
				}
			}
			t.Errorf("Pick = %d, want one of %v", got, tt.want)
		})
	}
}

// TestCacheAwareRandomTies checks random ties are spread over every tied
// row and never reach an untied one.
func TestCacheAwareRandomTies(t *testing.T) {
	for _, tt := range []struct {
		name    string
		params  shared.Params
		counts  []int64
		overlap []int32
		tied    []int
	}{
		{"least loaded", aibrixParams(3), []int64{1, 4, 1, 1}, []int32{0, 0, 0, 0}, []int{0, 2, 3}},
		{"equal matches, equal loads", aibrixParams(5), []int64{2, 2, 2, 1}, []int32{5, 0, 5, 0}, []int{0, 2}},
		{"equal matches, loads ignored", shared.Params{ParamSeed: int64(9)}, []int64{2, 0, 7}, []int32{6, 0, 6}, []int{0, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewCacheAware(tt.params)
			if err != nil {
				t.Fatal(err)
			}
			c := &shared.Candidates{IDs: idsN(len(tt.counts)), ActiveRequests: tt.counts, OverlapBlocks: tt.overlap}
			req := &shared.Request{PromptTokens: 1000, BlockSize: 100}
			const picks = 3000
			hits := map[int]int{}
			for range picks {
				row, err := a.Pick(context.Background(), req, c)
				if err != nil {
					t.Fatal(err)
				}
				hits[row]++
			}
			if len(hits) != len(tt.tied) {
				t.Fatalf("rows picked %v, want exactly %v", hits, tt.tied)
			}
			share := picks / len(tt.tied)
			for _, r := range tt.tied {
				if h := hits[r]; h < share*8/10 || h > share*12/10 {
					t.Errorf("row %d picked %d times of %d, want about %d", r, h, picks, share)
				}
			}
		})
	}
}

func TestCacheAwareErrors(t *testing.T) {
	typ := CacheAwareType()
	checkNew(t, typ, shared.Params{}, "")
	checkNew(t, typ, shared.Params{ParamCacheThreshold: 1.0}, ParamCacheThreshold)
	checkNew(t, typ, shared.Params{ParamCacheThreshold: -0.1}, ParamCacheThreshold)
	checkNew(t, typ, shared.Params{ParamBalanceRel: 0.5}, ParamBalanceRel)
	checkNew(t, typ, shared.Params{ParamBalanceAbs: -1.0}, ParamBalanceAbs)
	checkNew(t, typ, shared.Params{ParamStddevFactor: -1.0}, ParamStddevFactor)
	checkNew(t, typ, shared.Params{ParamImbalanced: "spill"}, ParamImbalanced)
	checkNew(t, typ, shared.Params{ParamMatchTies: "first"}, ParamMatchTies)
	checkNew(t, typ, shared.Params{ParamTies: "rotate"}, ParamTies)

	a, _ := NewCacheAware(nil)
	if got := a.Inputs(); got != shared.InputActiveRequests|shared.InputCache {
		t.Errorf("Inputs = %v, want ACTIVE_REQUESTS|CACHE", got)
	}
	req := &shared.Request{PromptTokens: 10, BlockSize: 16}
	if _, err := a.Pick(context.Background(), req, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("empty: err = %v, want ErrNoWorkers", err)
	}
	c := &shared.Candidates{IDs: idsN(2), ActiveRequests: []int64{1, 2}}
	if _, err := a.Pick(context.Background(), req, c); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no CACHE: err = %v, want ErrMissingColumn", err)
	}
	// Block size 0 matches nothing: the least loaded row.
	c.OverlapBlocks = []int32{5, 0}
	if row, err := a.Pick(context.Background(), &shared.Request{PromptTokens: 10}, c); err != nil || row != 0 {
		t.Errorf("block size 0: Pick = %d, %v; want 0, nil", row, err)
	}
}
