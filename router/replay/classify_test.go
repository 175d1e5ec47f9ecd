package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// classifyPolicy has a queue of two classes and the header-priority
// classifier, which reads the trace's priority and policy_class fields.
const classifyPolicy = `
queue {
  max_active_requests = 1
  aging               = "1s"
  max_waiting         = 50
  default_class       = "batch"
  class "interactive" {
    weight = 3
  }
  class "batch" {
    weight = 1
    order  = "wspt"
  }
}

request_classifier {
  type = "header-priority"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`

// writeClassTrace writes a Mooncake trace of n requests arriving together:
// every third is interactive, the others carry no class (the queue's
// default, batch); priorities 0..3.
func writeClassTrace(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		class := ""
		if i%3 == 0 {
			class = `, "policy_class": "interactive"`
		}
		fmt.Fprintf(&b, `{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [%d, %d], "priority": %d, "session_id": "s%d"%s}`+"\n",
			2*i, 2*i+1, i%4, i%5, class)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A sweep of a policy with a queue block and request_classifier: every
// request is classified from its trace fields, the per-request lines carry
// priority and policy_class, the report summarises each class, the table
// prints a line per class, and requests beyond max_waiting are rejected.
func TestSweepClassifiesAndQueues(t *testing.T) {
	dir := t.TempDir()
	policy, tr := filepath.Join(dir, "classes.hcl"), filepath.Join(dir, "classes.jsonl")
	if err := os.WriteFile(policy, []byte(classifyPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	const n = 60 // 2 workers take 1 each, 50 wait, 8 are refused
	writeClassTrace(t, tr, n)
	var perReq bytes.Buffer
	res := runSweep(t, &Sweep{Trace: openTrace(t, tr, 0), Policies: []string{policy}, Fleets: []Fleet{{Workers: 2}}, PerRequest: &perReq})
	out := tableOf(t, res, report.Comparison{})
	for _, s := range []string{"classes/interactive", "classes/batch", "POLICY/CLASS"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	if reason, _ := res.Reports[0].TopRejection(); res.Reports[0].Rejected != 8 || !strings.Contains(reason, "queue is full") {
		t.Errorf("%d of 60 requests rejected, most for %q; want 8 because the queue is full", res.Reports[0].Rejected, reason)
	}

	b := reportJSON(t, res.Reports[0])
	type summary struct{ P50, P90, P99, Mean float64 }
	var rep struct {
		Requests, Completed, Rejected int
		Classes                       map[string]struct {
			Requests  int     `json:"requests"`
			Completed int     `json:"completed"`
			Rejected  int     `json:"rejected"`
			TTFT      summary `json:"ttft_ms"`
			Queue     summary `json:"queue_ms"`
		} `json:"classes"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests != n || rep.Completed != 52 || rep.Rejected != 8 || len(rep.Classes) != 2 {
		t.Fatalf("report %+v", rep)
	}
	in, bt := rep.Classes["interactive"], rep.Classes["batch"]
	if in.Requests != 20 || bt.Requests != 40 || in.Completed+bt.Completed != 52 || in.Rejected+bt.Rejected != 8 {
		t.Fatalf("classes %+v", rep.Classes)
	}
	for name, c := range rep.Classes {
		if c.TTFT.P50 <= 0 || c.TTFT.P99 < c.TTFT.P50 || c.Queue.P99 < c.Queue.P50 || c.TTFT.Mean <= c.Queue.Mean {
			t.Errorf("class %s: %+v", name, c)
		}
	}
	// Weight 3 against 1: the interactive requests wait less.
	if in.Queue.Mean >= bt.Queue.Mean {
		t.Errorf("interactive mean queue %v ms >= batch %v ms", in.Queue.Mean, bt.Queue.Mean)
	}

	for i, l := range strings.Split(strings.TrimSpace(perReq.String()), "\n") {
		var o struct {
			Index       int     `json:"index"`
			Priority    *int    `json:"priority"`
			PolicyClass string  `json:"policy_class"`
			QueueMs     float64 `json:"queue_ms"`
			Status      string  `json:"status"`
		}
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatal(err)
		}
		want := "batch"
		if i%3 == 0 {
			want = "interactive"
		}
		if o.Index != i || o.Priority == nil || *o.Priority != i%4 || o.PolicyClass != want {
			t.Errorf("line %d: %s", i, l)
		}
		if o.Status != "ok" && !strings.HasPrefix(o.Status, "rejected: ") {
			t.Errorf("line %d: status %q", i, o.Status)
		}
	}
}

// A classification that fails every request (here each names a class the
// queue lacks) is one rejection reason counted once per request, not one
// reason per request id: the reasons stay as many as the ways to fail.
func TestRejectionReasonsGroupAcrossRequests(t *testing.T) {
	dir := t.TempDir()
	policy, tr := filepath.Join(dir, "p.hcl"), filepath.Join(dir, "t.jsonl")
	const pol = `
queue {
  default_class = "a"
  class "a" {
    weight = 1
  }
}

request_classifier {
  type = "header-priority"
}

policy "rr" {
  picker "rr" {
    type = "round-robin"
  }
}

worker_selection {
  aggregated = "rr"
}
`
	if err := os.WriteFile(policy, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	const n = 25
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 10, "output_length": 2, "hash_ids": [%d], "policy_class": "zzz"}`+"\n", i, i)
	}
	if err := os.WriteFile(tr, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	res := runSweep(t, &Sweep{Trace: openTrace(t, tr, 0), Policies: []string{policy}, Fleets: []Fleet{{Workers: 2}}})
	rep := res.Reports[0]
	const want = `unknown policy class "zzz" (queue classes: a)`
	if rep.Rejected != n || len(rep.RejectionReasons) != 1 || rep.RejectionReasons[want] != n {
		t.Fatalf("%d of %d rejected, reasons %v; want all, as {%q: %d}", rep.Rejected, n, rep.RejectionReasons, want, n)
	}
	if reason, count := rep.TopRejection(); reason != want || count != n {
		t.Errorf("TopRejection = %q, %d; want %q, %d", reason, count, want, n)
	}

	// No request completed: the latency distributions have no sample, and
	// the JSON report says null, not 0 ms.
	var got map[string]json.RawMessage
	if err := json.Unmarshal(reportJSON(t, rep), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ttft_ms", "e2e_ms", "queue_ms", "tpot_ms", "itl_ms"} {
		if string(got[k]) != "null" {
			t.Errorf("%s = %s, want null", k, got[k])
		}
	}
	if string(got["completed"]) != "0" {
		t.Errorf("completed = %s, want 0", got["completed"])
	}
}
