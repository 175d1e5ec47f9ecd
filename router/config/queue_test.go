package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

func TestQueueBlock(t *testing.T) {
	load := func(src string) (*PolicyFile, string) {
		b, diags := Load("q.hcl", []byte(src), testCatalog(t))
		return b, FormatDiagnostics(diags)
	}
	b, diags := load("")
	if b == nil || !cmp.Equal(DefaultQueue(), b.Queue) {
		t.Fatalf("no queue block: %+v %s", b, diags)
	}
	src := `queue {
  max_active_requests = 64
  max_waiting         = 1000
  aging               = "2s"
  default_class       = "batch"
  class "interactive" {
    weight = 3
  }
  class "batch" {
    weight = 1
    order  = "wspt"
  }
}
`
	b, diags = load(src)
	if b == nil || diags != "" {
		t.Fatalf("diagnostics:\n%s", diags)
	}
	want := Queue{MaxActiveRequests: 64, MaxWaiting: 1000, Aging: 2 * time.Second, DefaultClass: "batch",
		Classes: []QueueClass{{Name: "interactive", Weight: 3, Order: OrderFCFS}, {Name: "batch", Weight: 1, Order: OrderWSPT}}}
	if diff := cmp.Diff(want, b.Queue, cmpopts.IgnoreTypes(hcl.Range{})); diff != "" {
		t.Fatalf("queue (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ src, want string }{
		{"queue {\n  class \"a\" {\n    weight = 0\n  }\n}\n", "q.hcl:3:14: error: Invalid weight"},
		{"queue {\n  class \"a\" {\n    order = \"sjf\"\n  }\n}\n", "q.hcl:3:13: error: Invalid order"},
		{"queue {\n  class \"a\" {\n  }\n  class \"a\" {\n  }\n}\n", "q.hcl:4:9: error: Duplicate queue class"},
		{"queue {\n  class \"default\" {\n  }\n}\n", "q.hcl:2:9: error: Reserved name"},
		{"queue {\n}\n", "q.hcl:1:1: error: Queue without classes"},
		{"queue {\n  default_class = \"x\"\n  class \"a\" {\n  }\n}\n", "q.hcl:2:19: error: Unknown queue class"},
		{"queue {\n  max_active_requests = -1\n  class \"a\" {\n  }\n}\n", "q.hcl:2:25: error: Invalid max_active_requests"},
		{"queue {\n  aging = \"0s\"\n  class \"a\" {\n  }\n}\n", "q.hcl:2:3: warning: Strict priority can starve requests"},
		{"queue {\n  class \"a\" {\n  }\n}\nqueue {\n  class \"b\" {\n  }\n}\n", "q.hcl:5:1: error: Duplicate queue block"},
	} {
		if _, diags := load(tt.src); !strings.Contains(diags, tt.want) {
			t.Errorf("%q:\n%s\nwant %q", tt.src, diags, tt.want)
		}
	}
}

// TestQueueClassSLO: a class's ttft, tpot and on_miss, and the slack
// order; bad values are errors at the attribute's file:line:col.
func TestQueueClassSLO(t *testing.T) {
	load := func(src string) (*PolicyFile, string) {
		b, diags := Load("q.hcl", []byte(src), testCatalog(t))
		return b, FormatDiagnostics(diags)
	}
	src := `queue {
  class "chat" {
    order   = "slack"
    ttft    = "500ms"
    tpot    = "50ms"
    on_miss = "reject"
  }
  class "batch" {
    tpot = "200ms"
  }
  class "plain" {
  }
}
`
	b, diags := load(src)
	if b == nil || diags != "" {
		t.Fatalf("diagnostics:\n%s", diags)
	}
	want := []QueueClass{
		{Name: "chat", Weight: 1, Order: OrderSlack, SLO: shared.SLO{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, OnMiss: shared.SLOMissReject}},
		{Name: "batch", Weight: 1, Order: OrderFCFS, SLO: shared.SLO{TPOT: 200 * time.Millisecond}},
		{Name: "plain", Weight: 1, Order: OrderFCFS},
	}
	if diff := cmp.Diff(want, b.Queue.Classes, cmpopts.IgnoreTypes(hcl.Range{})); diff != "" {
		t.Fatalf("classes (-want +got):\n%s", diff)
	}
	for _, tt := range []struct{ src, want string }{
		{"queue {\n  class \"a\" {\n    ttft = \"soon\"\n  }\n}\n", "q.hcl:3:12: error: Invalid duration"},
		{"queue {\n  class \"a\" {\n    ttft = \"-1s\"\n  }\n}\n", "q.hcl:3:12: error: Invalid ttft"},
		{"queue {\n  class \"a\" {\n    tpot = \"2h\"\n  }\n}\n", "q.hcl:3:12: error: Invalid tpot"},
		{"queue {\n  class \"a\" {\n    tpot = 5\n  }\n}\n", "q.hcl:3:12: error:"},
		{"queue {\n  class \"a\" {\n    on_miss = \"shed\"\n  }\n}\n", "q.hcl:3:15: error: Invalid on_miss"},
		{"queue {\n  class \"a\" {\n    order = \"edf\"\n  }\n}\n", `order must be "fcfs", "lcfs", "wspt" or "slack", got "edf".`},
	} {
		if _, diags := load(tt.src); !strings.Contains(diags, tt.want) {
			t.Errorf("%q:\n%s\nwant %q", tt.src, diags, tt.want)
		}
	}
}

// TestClassifierQueueClasses: the queue classes a built-in classifier's
// parameters name (header-priority's default_class, prompt-length-class's
// buckets) must be classes of the file's queue, or of the default queue
// ("default") without a queue block; one that is not is an error at the
// parameter's value, not a router that refuses every request so
// classified. An empty default_class (the queue's default) names none, and
// a queue block with errors is not checked against.
func TestClassifierQueueClasses(t *testing.T) {
	load := func(src string) (*PolicyFile, string) {
		b, diags := Load("q.hcl", []byte(src), catalog.Default())
		return b, FormatDiagnostics(diags)
	}
	const queueAB = "queue {\n  class \"a\" {\n  }\n  class \"b\" {\n  }\n}\n"
	for _, tt := range []struct{ src, want string }{
		{queueAB + "request_classifier {\n  type = \"header-priority\"\n  default_class = \"zzz\"\n}\n",
			`q.hcl:9:19: error: Unknown queue class; default_class names queue class "zzz", which the queue block does not have (classes: a, b); ` +
				`every request so classified would be refused. Name one of them, or add class "zzz" to the queue.` + "\n"},
		{"request_classifier {\n  type = \"header-priority\"\n  default_class = \"a\"\n}\n",
			`q.hcl:3:19: error: Unknown queue class; default_class names queue class "a", which the default queue (no queue block) does not have (classes: default); ` +
				`every request so classified would be refused. Name one of them, or add class "a" to the queue.` + "\n"},
		{queueAB + "request_classifier {\n  type = \"prompt-length-class\"\n  buckets = \"a:100,c:200,b\"\n}\n",
			`q.hcl:9:13: error: Unknown queue class; buckets names queue class "c", which the queue block does not have (classes: a, b); ` +
				`every request so classified would be refused. Name one of them, or add class "c" to the queue.` + "\n"},
		{queueAB + "request_classifier {\n  type = \"header-priority\"\n  default_class = \"b\"\n}\n", ""},
		{queueAB + "request_classifier {\n  type = \"header-priority\"\n  default_class = \"\"\n}\n", ""},
		{queueAB + "request_classifier {\n  type = \"prompt-length-class\"\n  buckets = \"a:100,b\"\n}\n", ""},
		{"request_classifier {\n  type = \"header-priority\"\n}\n", ""},
		{"request_classifier {\n  type = \"prompt-length-class\"\n  buckets = \"default\"\n}\n", ""},
	} {
		b, diags := load(tt.src)
		if diags != tt.want {
			t.Errorf("%q:\n%s\nwant\n%s", tt.src, diags, tt.want)
		}
		if tt.want == "" && (b == nil || b.Classifier == nil) {
			t.Errorf("%q: no classifier loaded", tt.src)
		}
	}
	// A queue with errors (class "b" has a bad weight) is not checked
	// against: only its own error is reported.
	src := "queue {\n  class \"a\" {\n  }\n  class \"b\" {\n    weight = 0\n  }\n}\n" +
		"request_classifier {\n  type = \"header-priority\"\n  default_class = \"b\"\n}\n"
	if _, diags := load(src); !strings.HasPrefix(diags, "q.hcl:5:14: error: Invalid weight") || strings.Contains(diags, "Unknown queue class") {
		t.Errorf("%q:\n%s\nwant only the Invalid weight error", src, diags)
	}
}

// TestQueueString: the queue's summary (router validate's queue line) says
// "1 class", not "1 classes".
func TestQueueString(t *testing.T) {
	q := DefaultQueue()
	if got, want := q.String(), "1 class, aging 1s, max_active_requests 0"; got != want {
		t.Errorf("one class: %q, want %q", got, want)
	}
	q.Classes = append(q.Classes, QueueClass{Name: "b", Weight: 1})
	q.MaxActiveRequests = 64
	if got, want := q.String(), "2 classes, aging 1s, max_active_requests 64"; got != want {
		t.Errorf("two classes: %q, want %q", got, want)
	}
}
