package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/hcl/v2"
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
