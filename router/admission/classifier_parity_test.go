package admission

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/fleet"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/shared"
)

// The parity test's fleet: two models, two roles, three workers in each
// (model, role) partition, no worker in two partitions, so a target from
// another partition is never a candidate.
var (
	parityModels = []string{"m0", "m1"}
	parityRoles  = []shared.Role{shared.RolePrefill, shared.RoleDecode}
)

// parityWorkers returns the workers of a (model, role) partition:
// 10*(2*model+role) + 1..3.
func parityWorkers(model int, role int) []shared.WorkerID {
	base := shared.WorkerID(10 * (2*model + role))
	return []shared.WorkerID{base + 1, base + 2, base + 3}
}

// parityRemoved is the worker that leaves the fleet halfway through phase
// 1: one of m0's prefill workers.
const parityRemoved = shared.WorkerID(1)

// parityStep is one request of the sequence.
type parityStep struct {
	phase int // 1, or 2: after the clock jumped past every binding's ttl
	req   shared.Request
	// model and role index parityModels and parityRoles.
	model, role int
}

// parityAnswer is what one request got: its classification (as the
// Controller keeps it, with the defaulted scheduling cost) and its
// placement.
type parityAnswer struct {
	ID     string
	Class  shared.Classification
	Worker shared.WorkerID
	// ByTarget: the router took the advisory target without running the
	// policy.
	ByTarget bool
}

// paritySteps is the request sequence: 48 requests in phase 1 (one a
// second), then, after a jump of ten minutes, the last 16 of them again
// in reverse order. Request i is for model i%2 and role (i/8)%2, in
// session (i/2)%4, so each session id is used in all four partitions and
// each (model, role, session) three times; every seventh request has no
// session. A session's prompts grow by two blocks per request and share
// their prefix, so a partition that served the session before holds most
// of the next prompt. Metadata carries a priority and, for two requests in
// three, a class.
func paritySteps() []parityStep {
	var steps []parityStep
	turns := map[string]int{}
	for i := range 48 {
		s := parityStep{phase: 1, model: i % 2, role: (i / 8) % 2}
		r := shared.Request{ID: fmt.Sprintf("p1-%02d", i), Model: parityModels[s.model], Role: parityRoles[s.role],
			Metadata: map[string]string{"x-priority": fmt.Sprint(i%5 - 2)}}
		switch i % 3 {
		case 0:
			r.Metadata["x-policy-class"] = "interactive"
		case 1:
			r.Metadata["x-policy-class"] = "batch"
		}
		var ids []uint64
		if i%7 == 6 {
			ids = []uint64{uint64(9000 + 10*i), uint64(9001 + 10*i), uint64(9002 + 10*i)}
		} else {
			r.SessionID = fmt.Sprintf("s%d", (i/2)%4)
			n := 10 + 2*turns[r.SessionID]
			turns[r.SessionID]++
			for k := range n {
				ids = append(ids, uint64(1000*((i/2)%4+1)+k))
			}
		}
		r.PromptTokens = 16 * len(ids)
		r.BlockHashes = prefix.ChainHashes(nil, ids)
		s.req = r
		steps = append(steps, s)
	}
	for i := len(steps) - 1; i >= len(steps)-16; i-- {
		s := steps[i]
		s.phase = 2
		s.req.ID = "p2" + strings.TrimPrefix(s.req.ID, "p1")
		steps = append(steps, s)
	}
	return steps
}

// parityPolicy writes a policy file whose request_classifier is of type
// typ with params (HCL attributes), served by the plugin binary bin when
// bin is not empty; prefill and decode use round-robin, and the queue has
// the classes the classifiers name.
func parityPolicy(t *testing.T, typ, params, bin string) string {
	t.Helper()
	var plugin string
	if bin != "" {
		plugin = fmt.Sprintf("plugin \"cls\" {\n  command       = %q\n  start_timeout = \"60s\"\n  call_timeout  = \"60s\"\n}\n", bin)
	}
	src := fmt.Sprintf(`router {
  block_size = 16
}
%s
request_classifier {
  type = %q
  %s
}

queue {
  class "interactive" {}
  class "batch" {}
  class "short" {}
  class "long" {}
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  prefill = "rr"
  decode  = "rr"
}
`, plugin, typ, params)
	path := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runParity loads the policy file at path into a router over the parity
// fleet and runs steps through a Controller on a fake clock (one second
// per request, ten minutes between the phases), with events delivered
// inline, as replay does, so every classifier has heard a request's sent
// event before the next request is classified. Each request ends when the
// next one has been placed (completed, or aborted for every fifth), and
// parityRemoved leaves after request 24. It returns what every request
// got.
func runParity(t *testing.T, path string, steps []parityStep) []parityAnswer {
	t.Helper()
	ctx := context.Background()
	b, diags := loader.LoadBundle(ctx, path, loader.LoadOptions{})
	if diags.HasErrors() {
		t.Fatalf("loading %s: %v", path, diags)
	}
	r, err := router.New(router.Options{Bundle: b.Bundle, BookingsAreLoad: true})
	if err != nil {
		_ = b.Close(ctx)
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(ctx); err != nil {
			t.Errorf("closing the router: %v", err)
		}
	}()
	for m := range parityModels {
		for ro, role := range parityRoles {
			for _, id := range parityWorkers(m, ro) {
				if _, err := r.AddWorker(fleet.Spec{ID: id, Role: role, TotalKVBlocks: 1000, Models: []string{parityModels[m]}}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c, err := New(r, Options{Queue: b.Queue(), InlineEvents: true, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var answers []parityAnswer
	var prev *Handle
	end := func(i int) {
		if prev == nil {
			return
		}
		if i%5 == 0 {
			prev.End(Aborted("client disconnected"))
		} else {
			prev.End(Completed(int64(prev.Request().PromptTokens + 10)))
		}
		prev = nil
	}
	for i, s := range steps {
		if i > 0 && s.phase != steps[i-1].phase {
			end(i)
			clock.Add(int64(10 * time.Minute))
		} else {
			clock.Add(int64(time.Second))
		}
		if i == 25 {
			if err := r.RemoveWorker(parityRemoved, 0); err != nil {
				t.Fatal(err)
			}
		}
		req := s.req // Admit sets fields of the request it is given
		h, err := c.Admit(ctx, &req)
		if err != nil {
			t.Fatalf("admitting %s: %v", req.ID, err)
		}
		d, err := h.Wait(ctx)
		if err != nil {
			t.Fatalf("placing %s: %v", req.ID, err)
		}
		answers = append(answers, parityAnswer{ID: req.ID, Class: h.Classification(), Worker: d.Worker.ID, ByTarget: d.Target})
		end(i)
		prev = h
	}
	end(len(steps))
	return answers
}

// TestClassifierSameInAndOutOfProcess runs the same requests through two
// Controllers, one whose policy file's request_classifier is a built-in
// classifier in process and one whose is the same classifier served by a
// plugin process (testdata/classifierplugin), and requires the same
// answers: every classification (priority, class, scheduling cost,
// target) and every worker. The classifiers: session-affinity, which
// keeps per-partition state learned from lifecycle events and reads the
// partition's workers and clock, so it matches only if both sides make one
// classifier per (model, role) partition and feed it the same events,
// membership and time; prompt-length-class, whose answer depends on the
// cached prefix the router computed for the request; and header-priority,
// whose answer is the request's metadata.
func TestClassifierSameInAndOutOfProcess(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	bin := testkit.Build(t, "./testdata/classifierplugin")
	steps := paritySteps()
	cases := []struct {
		typ, params string
		check       func(t *testing.T, steps []parityStep, answers []parityAnswer)
	}{
		{"session-affinity", `ttl = "1m"`, checkAffinity},
		{"prompt-length-class", `buckets = "short:128,long"`, checkPromptLength},
		{"header-priority", `default_class = "short"`, checkHeaderPriority},
	}
	for _, tc := range cases {
		t.Run(tc.typ, func(t *testing.T) {
			in := runParity(t, parityPolicy(t, tc.typ, tc.params, ""), steps)
			out := runParity(t, parityPolicy(t, "oop-"+tc.typ, tc.params, bin), steps)
			if diff := cmp.Diff(in, out); diff != "" {
				t.Errorf("in process (-) and out of process (+) answered differently:\n%s", diff)
			}
			if len(in) != len(steps) {
				t.Fatalf("%d answers for %d requests", len(in), len(steps))
			}
			tc.check(t, steps, in)
		})
	}
	// Closing the routers stopped the plugin processes.
	deadline := time.Now().Add(30 * time.Second)
	for pids := procsOf(bin); len(pids) > 0; pids = procsOf(bin) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin processes left after the routers closed: %v", pids)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkAffinity checks session-affinity's answers against what it
// promises: a session request is targeted at the worker its session's
// previous request in the same (model, role) partition went to, when
// there was one in the same phase (the ten-minute jump expires every
// binding) and that worker is still a member; the router then takes the
// target. Nothing else is targeted, and no priority or class is set.
func checkAffinity(t *testing.T, steps []parityStep, answers []parityAnswer) {
	type combo struct {
		phase, model, role int
		session            string
	}
	last := map[combo]shared.WorkerID{}
	targeted := 0
	targetsByModel := map[string][]map[shared.WorkerID]bool{} // session -> per model: its targets
	for i, s := range steps {
		a := answers[i]
		if a.Class.Priority != 0 || a.Class.PolicyClass != "" {
			t.Errorf("%s: priority %d class %q, want neither", a.ID, a.Class.Priority, a.Class.PolicyClass)
		}
		want, ok := shared.WorkerID(0), false
		k := combo{s.phase, s.model, s.role, s.req.SessionID}
		if s.req.SessionID != "" {
			want, ok = last[k]
			ok = ok && !(i >= 25 && want == parityRemoved)
			last[k] = a.Worker
		}
		if a.Class.HasTarget != ok || (ok && a.Class.Target != want) {
			t.Errorf("%s (session %q, %s/%s, phase %d): target %d (set %v), want %d (set %v)",
				a.ID, s.req.SessionID, s.req.Model, s.req.Role, s.phase, a.Class.Target, a.Class.HasTarget, want, ok)
			continue
		}
		if !ok {
			continue
		}
		targeted++
		if !slices.Contains(parityWorkers(s.model, s.role), a.Class.Target) || !a.ByTarget || a.Worker != a.Class.Target {
			t.Errorf("%s: target %d not taken (worker %d, by target %v) in partition %v",
				a.ID, a.Class.Target, a.Worker, a.ByTarget, parityWorkers(s.model, s.role))
		}
		if targetsByModel[s.req.SessionID] == nil {
			targetsByModel[s.req.SessionID] = []map[shared.WorkerID]bool{{}, {}}
		}
		targetsByModel[s.req.SessionID][s.model][a.Class.Target] = true
	}
	if targeted < 20 {
		t.Errorf("%d requests targeted, want at least 20", targeted)
	}
	// The same session id is bound separately in each model's partitions.
	for session, byModel := range targetsByModel {
		if len(byModel[0]) == 0 || len(byModel[1]) == 0 {
			t.Errorf("session %s targeted in one model only: %v", session, byModel)
		}
		for w := range byModel[0] {
			if byModel[1][w] {
				t.Errorf("session %s targeted at worker %d in both models", session, w)
			}
		}
	}
}

// checkPromptLength checks prompt-length-class's answers: a session's
// first request in a partition finds nothing of it cached there, so its
// whole prompt (at least 160 tokens) is "long"; a request without a
// session (48 tokens) is "short"; and both classes occur often.
func checkPromptLength(t *testing.T, steps []parityStep, answers []parityAnswer) {
	type combo struct {
		model, role int
		session     string
	}
	seen := map[combo]bool{}
	count := map[string]int{}
	for i, s := range steps {
		a := answers[i]
		count[a.Class.PolicyClass]++
		if a.Class.HasTarget || a.Class.Priority != 0 {
			t.Errorf("%s: %+v, want only a class", a.ID, a.Class)
		}
		k := combo{s.model, s.role, s.req.SessionID}
		switch {
		case s.req.SessionID == "" && a.Class.PolicyClass != "short":
			t.Errorf("%s: class %q for a 48-token prompt, want short", a.ID, a.Class.PolicyClass)
		case s.req.SessionID != "" && !seen[k] && a.Class.PolicyClass != "long":
			t.Errorf("%s: class %q for session %s's first request in %s/%s, want long",
				a.ID, a.Class.PolicyClass, s.req.SessionID, s.req.Model, s.req.Role)
		}
		seen[k] = true
	}
	if count["short"] < 20 || count["long"] < 16 || count["short"]+count["long"] != len(steps) {
		t.Errorf("classes %v, want at least 20 short and 16 long, nothing else", count)
	}
}

// checkHeaderPriority checks header-priority's answers against the
// metadata: the priority given, and the class given or else the
// default_class.
func checkHeaderPriority(t *testing.T, steps []parityStep, answers []parityAnswer) {
	for i, s := range steps {
		a := answers[i]
		class := s.req.Metadata["x-policy-class"]
		if class == "" {
			class = "short"
		}
		if got, want := fmt.Sprint(a.Class.Priority), s.req.Metadata["x-priority"]; got != want || a.Class.PolicyClass != class || a.Class.HasTarget {
			t.Errorf("%s: %+v, want priority %s class %q and no target", a.ID, a.Class, want, class)
		}
	}
}

// procsOf lists the running processes whose executable is bin (Linux:
// none elsewhere).
func procsOf(bin string) []string {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.TrimSuffix(exe, " (deleted)") == bin {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
