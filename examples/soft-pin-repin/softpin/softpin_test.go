package softpin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/switchyard-router/switchyard/shared"
)

// step is one pick: the request's session, the in-flight counts of the
// candidate workers (by worker id), and the worker the pick must return
// and the session must be pinned to afterwards.
type step struct {
	session string
	active  map[shared.WorkerID]int64
	want    shared.WorkerID
}

// candidates lays the workers of active out in the order perm gives over
// their ascending ids.
func candidates(active map[shared.WorkerID]int64, perm []int) *shared.Candidates {
	ids := make([]shared.WorkerID, 0, len(active))
	for id := range active {
		ids = append(ids, id)
	}
	for i := 1; i < len(ids); i++ { // insertion sort; a handful of ids
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	c := &shared.Candidates{}
	for _, p := range perm {
		c.IDs = append(c.IDs, ids[p])
		c.ActiveRequests = append(c.ActiveRequests, active[ids[p]])
	}
	return c
}

// permutations returns every ordering of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for at := 0; at <= len(p); at++ {
			q := append(append(append(make([]int, 0, n), p[:at]...), n-1), p[at:]...)
			out = append(out, q)
		}
	}
	return out
}

// w builds an active-count map from id, count pairs.
func w(pairs ...int64) map[shared.WorkerID]int64 {
	m := make(map[shared.WorkerID]int64)
	for i := 0; i < len(pairs); i += 2 {
		m[shared.WorkerID(pairs[i])] = pairs[i+1]
	}
	return m
}

// pinnedTo returns the session's pinned worker id.
func (s *SoftPin) pinnedTo(session string) (shared.WorkerID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.pins[session]
	if !ok {
		return 0, false
	}
	return e.Value.(*pin).w.id, true
}

func TestSoftPin(t *testing.T) {
	tests := []struct {
		name      string
		maxActive int64
		steps     []step
	}{
		{"no session: least loaded, no pin", 2, []step{
			{"", w(10, 3, 20, 1, 30, 2), 20},
		}},
		{"no session: tie goes to lowest id", 2, []step{
			{"", w(10, 3, 20, 1, 30, 1, 40, 1), 20},
		}},
		{"new session pins the least loaded", 2, []step{
			{"s", w(10, 3, 20, 1, 30, 1), 20},
		}},
		{"stays while at most max (inclusive)", 2, []step{
			{"s", w(10, 0, 20, 1, 30, 1), 10},
			{"s", w(10, 2, 20, 0, 30, 0), 10},
			{"s", w(10, 1, 20, 0, 30, 0), 10},
		}},
		{"moves above max to the least-loaded other and re-pins", 2, []step{
			{"s", w(10, 0, 20, 1, 30, 1), 10},
			{"s", w(10, 3, 20, 2, 30, 1), 30},
			// Re-pinned: back under the limit everywhere, it stays on 30.
			{"s", w(10, 0, 20, 0, 30, 2), 30},
		}},
		{"moves: tie among the others goes to the lowest id", 2, []step{
			{"s", w(10, 5, 20, 0, 30, 9), 20},
			{"s", w(10, 1, 20, 3, 30, 1), 10},
			{"s", w(10, 2, 20, 0, 30, 0), 10},
		}},
		{"moves even when the pinned worker is the least loaded", 0, []step{
			{"s", w(10, 0, 20, 0), 10},
			{"s", w(10, 1, 20, 4, 30, 2), 30},
			{"s", w(10, 0, 20, 0, 30, 1), 10},
		}},
		{"max 0 stays only on an idle worker", 0, []step{
			{"s", w(10, 0, 20, 0), 10},
			{"s", w(10, 0, 20, 5), 10},
		}},
		{"the only candidate is kept over the limit", 1, []step{
			{"s", w(10, 0, 20, 0), 10},
			{"s", w(10, 7), 10},
		}},
		{"pinned worker gone: least loaded, re-pinned", 2, []step{
			{"s", w(10, 1, 20, 0, 30, 0), 20},
			{"s", w(10, 1, 30, 2, 40, 1), 10},
			{"s", w(10, 2, 20, 0, 30, 0, 40, 0), 10},
		}},
		{"sessions are independent", 1, []step{
			{"a", w(10, 0, 20, 0), 10},
			{"b", w(10, 1, 20, 0), 20},
			{"a", w(10, 1, 20, 0), 10},
			{"b", w(10, 0, 20, 2), 10},
			{"a", w(10, 2, 20, 3), 20},
			{"", w(10, 2, 20, 3), 10},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(tt.steps[0].active)
			for _, st := range tt.steps {
				n = max(n, len(st.active))
			}
			// Replay the steps in every row order, with a fresh instance each
			// time: the picks must not depend on the order.
			for _, perm := range permutations(n) {
				s, err := NewSoftPin(shared.Params{ParamMaxActiveRequests: tt.maxActive})
				if err != nil {
					t.Fatal(err)
				}
				sessions := map[string]bool{}
				for i, st := range tt.steps {
					p := perm
					if len(st.active) != n { // a smaller set: keep the order's relative ranks
						p = restrict(perm, len(st.active))
					}
					c := candidates(st.active, p)
					row, err := s.Pick(context.Background(), &shared.Request{SessionID: st.session}, c)
					if err != nil {
						t.Fatal(err)
					}
					if c.IDs[row] != st.want {
						t.Fatalf("order %v, step %d: picked worker %d, want %d", perm, i, c.IDs[row], st.want)
					}
					if st.session == "" {
						continue
					}
					sessions[st.session] = true
					if got, ok := s.pinnedTo(st.session); !ok || got != st.want {
						t.Fatalf("order %v, step %d: session pinned to %d (%v), want %d", perm, i, got, ok, st.want)
					}
				}
				if s.Sessions() != len(sessions) {
					t.Fatalf("Sessions() = %d, want %d (a request without a session pins nothing)", s.Sessions(), len(sessions))
				}
			}
		})
	}
}

// restrict maps a permutation of 0..len(perm)-1 to one of 0..k-1 that keeps
// the relative order of the values below k.
func restrict(perm []int, k int) []int {
	out := make([]int, 0, k)
	for _, v := range perm {
		if v < k {
			out = append(out, v)
		}
	}
	return out
}

func TestSoftPinDPRanks(t *testing.T) {
	s, _ := NewSoftPin(shared.Params{ParamMaxActiveRequests: int64(1)})
	req := &shared.Request{SessionID: "s"}
	c := &shared.Candidates{
		IDs:            []shared.WorkerID{1, 1, 2},
		DPRanks:        []uint32{0, 1, 0},
		ActiveRequests: []int64{2, 0, 0},
	}
	// Least loaded ties (1,1) and (2,0): (1,1) has the lower id.
	if row, _ := s.Pick(context.Background(), req, c); row != 1 {
		t.Fatalf("first pick row %d, want 1 (worker 1 rank 1)", row)
	}
	// Rank 1 of worker 1 stays pinned even when rank 0 is idler.
	c.ActiveRequests = []int64{0, 1, 0}
	if row, _ := s.Pick(context.Background(), req, c); row != 1 {
		t.Fatalf("second pick row %d, want 1 (stays on worker 1 rank 1)", row)
	}
	// Over the limit: moves to the least-loaded other, (1,0) by rank order.
	c.ActiveRequests = []int64{0, 2, 0}
	if row, _ := s.Pick(context.Background(), req, c); row != 0 {
		t.Fatalf("third pick row %d, want 0 (worker 1 rank 0)", row)
	}
	// Without ranks, (1,0) is worker 1 and is still found.
	c2 := &shared.Candidates{IDs: []shared.WorkerID{1, 2}, ActiveRequests: []int64{1, 0}}
	if row, _ := s.Pick(context.Background(), req, c2); row != 0 {
		t.Fatalf("fourth pick row %d, want 0 (pinned worker 1 rank 0)", row)
	}
}

func TestSoftPinEvictsLeastRecentlyUsed(t *testing.T) {
	s, err := NewSoftPin(shared.Params{ParamMaxActiveRequests: int64(10), ParamMaxSessions: int64(2)})
	if err != nil {
		t.Fatal(err)
	}
	pick := func(session string, active ...int64) shared.WorkerID {
		t.Helper()
		c := &shared.Candidates{IDs: []shared.WorkerID{10, 20}, ActiveRequests: active}
		row, err := s.Pick(context.Background(), &shared.Request{SessionID: session}, c)
		if err != nil {
			t.Fatal(err)
		}
		return c.IDs[row]
	}
	pinned := func() []string {
		var out []string
		for _, session := range []string{"a", "b", "c"} {
			if id, ok := s.pinnedTo(session); ok {
				out = append(out, fmt.Sprintf("%s=%d", session, id))
			}
		}
		return out
	}
	pick("a", 0, 1) // a -> 10
	pick("b", 1, 0) // b -> 20
	pick("a", 5, 0) // a stays on 10 and becomes the most recent
	pick("c", 0, 0) // full: forgets b, the least recently used
	if diff := cmp.Diff([]string{"a=10", "c=10"}, pinned()); diff != "" {
		t.Fatalf("pins (-want +got):\n%s", diff)
	}
	// b is placed like a new session: least loaded, not its old pin 20.
	if got := pick("b", 0, 3); got != 10 {
		t.Errorf("evicted session picked %d, want 10", got)
	}
	if diff := cmp.Diff([]string{"b=10", "c=10"}, pinned()); diff != "" {
		t.Errorf("pins (-want +got):\n%s", diff)
	}
	if s.Sessions() != 2 {
		t.Errorf("Sessions() = %d, want 2", s.Sessions())
	}
}

func TestSoftPinParams(t *testing.T) {
	tests := []struct {
		name      string
		params    shared.Params
		wantParam string
	}{
		{"zero", shared.Params{ParamMaxActiveRequests: int64(0)}, ""},
		{"large", shared.Params{ParamMaxActiveRequests: int64(1 << 40)}, ""},
		{"one session", shared.Params{ParamMaxActiveRequests: int64(1), ParamMaxSessions: int64(1)}, ""},
		{"absent", nil, ParamMaxActiveRequests},
		{"negative", shared.Params{ParamMaxActiveRequests: int64(-1)}, ParamMaxActiveRequests},
		{"no sessions", shared.Params{ParamMaxActiveRequests: int64(1), ParamMaxSessions: int64(0)}, ParamMaxSessions},
		{"negative sessions", shared.Params{ParamMaxActiveRequests: int64(1), ParamMaxSessions: int64(-5)}, ParamMaxSessions},
	}
	typ := SoftPinType()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := typ.New(shared.InstanceInfo{Role: shared.RoleAggregated}, typ.WithDefaults(tt.params))
			if tt.wantParam == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			var pe *shared.ParamError
			if !errors.As(err, &pe) || pe.Param != tt.wantParam {
				t.Fatalf("New error = %v, want *ParamError for %q", err, tt.wantParam)
			}
		})
	}
	s, _ := NewSoftPin(typ.WithDefaults(shared.Params{ParamMaxActiveRequests: int64(1)}))
	if s.maxSessions != DefaultMaxSessions {
		t.Errorf("default max_sessions = %d, want %d", s.maxSessions, DefaultMaxSessions)
	}
}

func TestSoftPinTypeAndErrors(t *testing.T) {
	ti := SoftPinType()
	if ti.Kind != shared.KindPicker || ti.Inputs != shared.InputActiveRequests || len(Types()) != 2 {
		t.Errorf("descriptor %+v", ti)
	}
	s, _ := NewSoftPin(shared.Params{ParamMaxActiveRequests: int64(1)})
	if s.Inputs() != shared.InputActiveRequests {
		t.Errorf("Inputs() = %v", s.Inputs())
	}
	req := &shared.Request{SessionID: "s"}
	if _, err := s.Pick(context.Background(), req, &shared.Candidates{}); !errors.Is(err, shared.ErrNoWorkers) {
		t.Errorf("empty: %v, want ErrNoWorkers", err)
	}
	if _, err := s.Pick(context.Background(), req, &shared.Candidates{IDs: []shared.WorkerID{1}}); !errors.Is(err, ErrMissingColumn) {
		t.Errorf("no ACTIVE_REQUESTS: %v, want ErrMissingColumn", err)
	}
	if s.Sessions() != 0 {
		t.Error("a failed pick pinned a session")
	}
	if row, err := s.Pick(context.Background(), nil, &shared.Candidates{IDs: []shared.WorkerID{4, 5}, ActiveRequests: []int64{1, 0}}); err != nil || row != 1 {
		t.Errorf("nil request: %d, %v; want 1", row, err)
	}
}

// TestSoftPinConcurrentSessions drives many sessions from many goroutines
// (run with -race). Each session's picks depend only on its own pin, so
// every goroutine sees the same hand-computed sequence.
func TestSoftPinConcurrentSessions(t *testing.T) {
	for _, maxSessions := range []int64{DefaultMaxSessions, 3} {
		t.Run(fmt.Sprint("max_sessions=", maxSessions), func(t *testing.T) {
			s, _ := NewSoftPin(shared.Params{ParamMaxActiveRequests: int64(2), ParamMaxSessions: maxSessions})
			ids := []shared.WorkerID{10, 20, 30}
			rounds := []struct {
				active []int64
				want   shared.WorkerID
			}{
				{[]int64{0, 0, 0}, 10}, // new: least loaded, lowest id
				{[]int64{5, 0, 1}, 20}, // 10 over 2: least-loaded other
				{[]int64{0, 2, 0}, 20}, // stays (2 <= 2)
				{[]int64{0, 5, 3}, 10}, // 20 over 2: moves to 10
				{[]int64{1, 0, 0}, 10}, // stays
			}
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for k := range 50 {
						session := fmt.Sprintf("g%d-s%d", g, k)
						for i, r := range rounds {
							c := &shared.Candidates{IDs: ids, ActiveRequests: r.active}
							row, err := s.Pick(context.Background(), &shared.Request{SessionID: session}, c)
							if err != nil {
								t.Error(err)
								return
							}
							// With a small bound other goroutines may evict this
							// session between rounds; it is then placed as new.
							if maxSessions == DefaultMaxSessions && ids[row] != r.want {
								t.Errorf("%s round %d: picked %d, want %d", session, i, ids[row], r.want)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			want := min(16*50, int(maxSessions))
			if got := s.Sessions(); got != want {
				t.Errorf("Sessions() = %d, want %d", got, want)
			}
		})
	}
}

// TestSoftPinSharedSession hammers one session from many goroutines: every
// pick is one of the workers the rule allows and the pin stays consistent.
func TestSoftPinSharedSession(t *testing.T) {
	s, _ := NewSoftPin(shared.Params{ParamMaxActiveRequests: int64(0)})
	ids := []shared.WorkerID{1, 2}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				// Worker 1 busy on even steps of even goroutines.
				busy := int64((g + i) % 2)
				c := &shared.Candidates{IDs: ids, ActiveRequests: []int64{busy, 0}}
				if _, err := s.Pick(context.Background(), &shared.Request{SessionID: "shared"}, c); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if s.Sessions() != 1 {
		t.Errorf("Sessions() = %d, want 1", s.Sessions())
	}
	if id, ok := s.pinnedTo("shared"); !ok || (id != 1 && id != 2) {
		t.Errorf("pinned to %d (%v)", id, ok)
	}
}
