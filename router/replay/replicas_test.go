package replay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// runReplicas replays recs through n replicas of the policy file src
// (each replica loads its own instances, as router replay loads the file
// once per replica) on workers aggregated workers, with the file's queue
// block when it has one.
func runReplicas(t testing.TB, src string, recs []trace.Record, workers, n int, delay time.Duration, mode PrefixMode, perReq *bytes.Buffer) (*report.Report, *driver) {
	t.Helper()
	b := loadPolicy(t, src)
	o := Options{PolicyName: "p", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t", Records: recs, Workers: workers,
		Prefix: mode, Replicas: n, SyncDelay: delay,
		Replica: func(int) (Replica, error) { return Replica{Roles: loadPolicy(t, src).Roles}, nil }}
	if mode == PrefixPrecise {
		o.KVEventDelay = DefaultKVEventDelay
	}
	if b.Queue.Range.Filename != "" { // a queue block, as router replay passes it
		o.Queue = b.Queue
	}
	if perReq != nil {
		o.PerRequest = perReq
	}
	rep, d, err := execute(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return rep, d
}

// checkReplicas asserts what every replayed run with replicas ends with:
// every request completed, each placed hop mirrored on every other
// replica, and every replica's bookings, its own and the mirrored ones,
// released.
func checkReplicas(t *testing.T, rep *report.Report, d *driver, n int) {
	t.Helper()
	if rep.Completed != rep.Requests {
		t.Errorf("%d of %d requests completed", rep.Completed, rep.Requests)
	}
	if rep.Sync == nil || rep.Sync.Replicas != n || rep.Sync.Mirrored != int64(n-1)*rep.Selections {
		t.Errorf("sync report %+v, want %d replicas and %d mirrored bookings", rep.Sync, n, int64(n-1)*rep.Selections)
	}
	if d.sync.events.Len() != 0 {
		t.Errorf("%d sync events never applied", d.sync.events.Len())
	}
	checkBookingsReleased(t, d)
}

// One replica is the replay without replicas, byte for byte: the golden
// hash of TestDefaultConfigOutputUnchanged, in both prefix modes.
func TestOneReplicaIsTheReplay(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	var one bytes.Buffer
	rep, _ := runReplicas(t, seededDefault, recs, 4, 1, 0, PrefixApproximate, &one)
	sum := sha256.Sum256(one.Bytes())
	if got, want := hex.EncodeToString(sum[:]), "61af6038cd9dd1612db710112e7321a60a069269d70f25800110285cbd776335"; got != want {
		t.Errorf("Replicas 1: per-request sha256 %s, want the golden %s", got, want)
	}
	if rep.Sync != nil || rep.Label() != "p" {
		t.Errorf("Replicas 1: sync %+v, label %q; want none, p", rep.Sync, rep.Label())
	}
	var none, precise bytes.Buffer
	runPrefix(t, recs, 4, smallKV(), PrefixPrecise, DefaultKVEventDelay, &none)
	b := loadPolicy(t, seededKVCost)
	if _, err := Run(context.Background(), Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: recs, Workers: 4, Sim: smallKV(), Prefix: PrefixPrecise, KVEventDelay: DefaultKVEventDelay, Replicas: 1,
		PerRequest: &precise}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(none.Bytes(), precise.Bytes()) {
		t.Error("precise mode: Replicas 1 and no replicas differ")
	}
}

// On the bundled conversation trace at 8 workers, three replicas that see
// each other's decisions at once (sync delay 0) route as one router does:
// measured KV hit 14.96% against 14.79% and TTFT p90 951 ms against 950.
// They are not the same decisions: each replica has its own policy
// instances, whose min-cost tie-breaks draw from their own seeded
// streams. A delay of 1 ms already costs a third more TTFT p90 (1,311
// ms): the trace's arrivals come in bursts at one instant (12,031
// requests at 1,180 timestamps), and replicas that cannot see the
// others' bookings within a burst send their requests to the same
// least-loaded workers. The cache is not what suffers (14.92%): a
// conversation's next turn comes seconds later, when every replica knows
// where the last one went. (Precise mode without delay is checked on the
// generated trace, TestSyncDelayLosesAffinity, which replays faster.)
func TestReplicasWithoutDelayRouteAsOne(t *testing.T) {
	recs := readTrace(t, "mooncake_conversation_trace.jsonl")
	one, _ := runReplicas(t, seededDefault, recs, 8, 1, 0, PrefixApproximate, nil)
	three, d := runReplicas(t, seededDefault, recs, 8, 3, 0, PrefixApproximate, nil)
	checkReplicas(t, three, d, 3)
	if diff := math.Abs(three.KVHitRatio - one.KVHitRatio); diff > 0.005 {
		t.Errorf("KV hit %.4f on 3 replicas, %.4f on one: want within half a point", three.KVHitRatio, one.KVHitRatio)
	}
	if r := three.TTFT.P90 / one.TTFT.P90; r < 0.97 || r > 1.03 {
		t.Errorf("TTFT p90 %.0f ms on 3 replicas, %.0f on one: want within 3%%", three.TTFT.P90, one.TTFT.P90)
	}
	late, d := runReplicas(t, seededDefault, recs, 8, 3, time.Millisecond, PrefixApproximate, nil)
	checkReplicas(t, late, d, 3)
	if late.TTFT.P90 < 1.25*three.TTFT.P90 {
		t.Errorf("sync delay 1ms: TTFT p90 %.0f ms, want at least a quarter above %.0f (no delay)", late.TTFT.P90, three.TTFT.P90)
	}
	if diff := math.Abs(late.KVHitRatio - three.KVHitRatio); diff > 0.005 {
		t.Errorf("sync delay 1ms: KV hit %.4f, want within half a point of %.4f (no delay)", late.KVHitRatio, three.KVHitRatio)
	}
}

// On the generated multi-turn trace, where a session's next turn comes
// about 30 s after the last (its answer streaming, then think time), a
// sync delay of the same order sends turns where their prefix is not:
// measured at 8 workers, KV hit 75.84% on one router, 73.20% with 3
// replicas and a 10 s delay, 64.31% with 60 s (approximate); in precise
// mode 76.48% on one router, 76.39% on three without delay, and 68.78%
// at 10 s, which is lower than approximate: a replica's own in-flight
// blocks leave its precise index a few engine steps after the request
// ends, while the engine's events telling that they are cached are still
// within the delay, whereas the approximate index keeps what the replica
// sent.
func TestSyncDelayLosesAffinity(t *testing.T) {
	recs := readTrace(t, "synthetic_sessions.jsonl")
	one := map[PrefixMode]*report.Report{}
	for _, mode := range []PrefixMode{PrefixApproximate, PrefixPrecise} {
		one[mode], _ = runReplicas(t, seededDefault, recs, 8, 1, 0, mode, nil)
	}
	for _, c := range []struct {
		mode     PrefixMode
		delay    time.Duration
		min, max float64 // the drop of KV hit from one router's, in points
	}{
		{PrefixApproximate, 10 * time.Second, 2, 100},
		{PrefixApproximate, time.Minute, 8, 100},
		{PrefixPrecise, 0, -0.5, 0.5},
		{PrefixPrecise, 10 * time.Second, 5, 100},
	} {
		three, d := runReplicas(t, seededDefault, recs, 8, 3, c.delay, c.mode, nil)
		checkReplicas(t, three, d, 3)
		if drop := 100 * (one[c.mode].KVHitRatio - three.KVHitRatio); drop < c.min || drop > c.max {
			t.Errorf("%v, sync delay %v: KV hit %.4f on 3 replicas, %.4f on one: a drop of %.2f points, want %g to %g",
				c.mode, c.delay, three.KVHitRatio, one[c.mode].KVHitRatio, drop, c.min, c.max)
		}
	}
}

// A replay with replicas repeats byte for byte, with a queue and KV
// events; the report names the replicas and the delay, and the row label
// carries them.
func TestReplicasRepeat(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")
	src := seededDefault + `
queue {
  max_active_requests = 6
  class "c" {
    weight = 1
  }
}
`
	var a, b bytes.Buffer
	repA, d := runReplicas(t, src, recs, 4, 3, 10*time.Millisecond, PrefixPrecise, &a)
	checkReplicas(t, repA, d, 3)
	repB, _ := runReplicas(t, src, recs, 4, 3, 10*time.Millisecond, PrefixPrecise, &b)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two runs with replicas differ")
	}
	if repA.KVHitRatio != repB.KVHitRatio || repA.TTFT != repB.TTFT {
		t.Errorf("reports differ: %v %+v, %v %+v", repA.KVHitRatio, repA.TTFT, repB.KVHitRatio, repB.TTFT)
	}
	if got, want := repA.Label(), "p+precise/3@10ms"; got != want {
		t.Errorf("label %q, want %q", got, want)
	}
	js, err := json.Marshal(repA)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"sync":{"replicas":3,"delay_ms":10,"mirrored":2000}`; !strings.Contains(string(js), want) {
		t.Errorf("report JSON lacks %s", want)
	}
}

// Mirrored bookings count in a peer's capacity, from SyncDelay after the
// decision until SyncDelay after the release. Two workers take one
// request each (max_active_requests = 1); requests alternate between two
// replicas, each with its own round-robin cursor. Request 0 (replica 0)
// takes worker 0 at t=0; request 1 (replica 1) arrives at 600 ms, when
// replica 1 knows of request 0 if the delay is under that, and takes
// worker 1; request 2 (replica 0) arrives at 1,200 ms to find both busy
// in replica 0's view, and waits until request 1's release reaches
// replica 0: at request 1's end plus the delay. With a delay over 600 ms,
// replica 1 does not know of request 0 and sends request 1 to worker 0
// too.
func TestMirroredBookingsHoldCapacity(t *testing.T) {
	const src = `
policy "rr" {
  picker "rr" { type = "round-robin" }
}
worker_selection { aggregated = "rr" }
queue {
  max_active_requests = 1
  class "c" {
    weight = 1
  }
}
`
	ms := time.Millisecond
	recs := []trace.Record{
		{Index: 0, Arrival: 0, InputLength: 1000, OutputLength: 3000},
		{Index: 1, Arrival: 600 * ms, InputLength: 1000, OutputLength: 100},
		{Index: 2, Arrival: 1200 * ms, InputLength: 100, OutputLength: 10},
	}
	outcomes := func(delay time.Duration) []Outcome {
		var buf bytes.Buffer
		rep, d := runReplicas(t, src, recs, 2, 2, delay, PrefixApproximate, &buf)
		checkReplicas(t, rep, d, 2)
		var out []Outcome
		dec := json.NewDecoder(&buf)
		for dec.More() {
			var o Outcome
			if err := dec.Decode(&o); err != nil {
				t.Fatal(err)
			}
			out = append(out, o)
		}
		return out
	}
	// Workers 0 and 1 of the comment are the candidate rows, in id order:
	// sim-1, then sim-0 (indexesByID).
	w0, w1 := indexesByID("sim-", 0, 2)[0], indexesByID("sim-", 0, 2)[1]
	for _, delay := range []time.Duration{0, 500 * ms} {
		o := outcomes(delay)
		if o[0].Worker != w0 || o[1].Worker != w1 || o[2].Worker != w1 {
			t.Fatalf("delay %v: workers %d, %d, %d; want %d, %d, %d", delay, o[0].Worker, o[1].Worker, o[2].Worker, w0, w1, w1)
		}
		end1 := o[1].ArrivalMs + o[1].E2EMs // request 1's release
		visible := end1 + float64(delay/ms) // at replica 0
		if o[2].QueueMs < visible-o[2].ArrivalMs || o[2].QueueMs > visible-o[2].ArrivalMs+50 {
			t.Errorf("delay %v: request 2 waited %.3f ms; want it dispatched when request 1's release (%.3f ms) reached replica 0 at %.3f ms",
				delay, o[2].QueueMs, end1, visible)
		}
	}
	o := outcomes(700 * ms)
	if o[0].Worker != w0 || o[1].Worker != w0 || o[2].Worker != w1 || o[2].QueueMs > 50 {
		t.Errorf("delay 700ms: workers %d, %d, %d, request 2 waited %.3f ms; want %d, %d, %d and no wait",
			o[0].Worker, o[1].Worker, o[2].Worker, o[2].QueueMs, w0, w0, w1)
	}
}

// Bad replica options are refused with an error that names them.
func TestReplicaOptionErrors(t *testing.T) {
	b := loadPolicy(t, seededDefault)
	recs := []trace.Record{{InputLength: 10, OutputLength: 1}}
	replica := func(int) (Replica, error) { return Replica{Roles: loadPolicy(t, seededDefault).Roles}, nil }
	for _, c := range []struct {
		replicas int
		delay    time.Duration
		replica  func(int) (Replica, error)
		want     string
	}{
		{65, 0, replica, "65 replicas, want 1 to 64"},
		{-1, 0, replica, "-1 replicas, want 1 to 64"},
		{3, -time.Millisecond, replica, "sync delay -1ms, want >= 0"},
		{1, time.Second, replica, "sync delay 1s with one replica"},
		{0, time.Second, nil, "sync delay 1s with one replica"},
		{3, 0, nil, "3 replicas without Options.Replica"},
		{3, 0, func(k int) (Replica, error) { return Replica{}, errors.New("no plugin") }, "replica 1: no plugin"},
		{3, 0, func(k int) (Replica, error) { return Replica{}, nil }, "replica 1: no policy for role aggregated"},
	} {
		_, err := Run(context.Background(), Options{PolicyName: "p", Roles: b.Roles, BlockSize: b.BlockSize, Records: recs, Workers: 2,
			Replicas: c.replicas, SyncDelay: c.delay, Replica: c.replica})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("replicas %d, delay %v: error %v, want %q", c.replicas, c.delay, err, c.want)
		}
	}
}

// Disaggregated serving with replicas: each request's prefill and decode
// hops are routed by its replica, and both hops are mirrored (two
// selections per request that reached a decode worker, each booked on
// the other replicas), so every replica's prefill and decode workers end
// with nothing booked.
func TestReplicasDisaggregated(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:300]
	b := loadPolicy(t, seededDefault)
	rep, d, err := execute(context.Background(), Options{PolicyName: "default", Roles: b.Roles, BlockSize: b.BlockSize, TraceName: "t",
		Records: recs, PrefillWorkers: 2, DecodeWorkers: 2, Replicas: 3, SyncDelay: 50 * time.Millisecond,
		Replica: func(int) (Replica, error) { return Replica{Roles: loadPolicy(t, seededDefault).Roles}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, rep, d, 3)
	if rep.Selections <= int64(rep.Requests) {
		t.Errorf("%d selections for %d requests, want the decode hops too", rep.Selections, rep.Requests)
	}
	if got := rep.Label(); got != "default(2P+2D)/3@50ms" {
		t.Errorf("label %q", got)
	}
}

// A policy that finds every worker busy (one request each, by the
// ACTIVE_REQUESTS it sees) queues requests without a queue block; with
// replicas, what it sees includes the others' requests a sync delay late.
// Two replicas on two workers: every request completes and nothing is
// left waiting or booked. Without delay a worker holds one request at a
// time, as under one router; with 300 ms, two when the replicas booked
// it within the delay of each other, which they do.
func TestReplicasPolicyAllBusyWaits(t *testing.T) {
	recs := readTrace(t, "mooncake_arxiv_trace_first1000.jsonl")[:40]
	busy := func() map[shared.Role]*policy.Policy {
		return map[shared.Role]*policy.Policy{shared.RoleAggregated: {Name: "one-each", PickerName: "p", PickerType: "busy-picker", Picker: busyPicker{limit: 1}}}
	}
	for _, c := range []struct {
		delay time.Duration
		most  int
	}{{0, 1}, {300 * time.Millisecond, 2}} {
		log := &eventLog{}
		rep, d, err := execute(context.Background(), Options{PolicyName: "busy", Roles: busy(), BlockSize: 512, TraceName: "arxiv", Records: recs,
			Workers: 2, Listeners: []shared.EventListener{log}, Replicas: 2, SyncDelay: c.delay,
			Replica: func(int) (Replica, error) { return Replica{Roles: busy()}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		checkReplicas(t, rep, d, 2)
		if d.waiting != 0 || d.reps[0].adm.Queued() != 0 || d.reps[1].adm.Queued() != 0 {
			t.Fatalf("delay %v: still waiting: driver %d, routers %d and %d", c.delay, d.waiting, d.reps[0].adm.Queued(), d.reps[1].adm.Queued())
		}
		if m := maxInFlight(log.events); m != c.most {
			t.Errorf("delay %v: at most %d requests in flight on a worker, want %d", c.delay, m, c.most)
		}
	}
}
