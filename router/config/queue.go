package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

// blockQueue is the queue block's name.
const blockQueue = "queue"

// Queue orders within a class.
const (
	OrderFCFS = "fcfs" // first come, first served (the default)
	OrderLCFS = "lcfs" // last come, first served
	OrderWSPT = "wspt" // weighted shortest processing time: the smallest scheduling cost first
	// OrderSlack serves the least slack first: the earliest latest useful
	// start, arrival + TTFT target - predicted TTFT; requests without a
	// TTFT target after those with one, first come first served.
	OrderSlack = "slack"
)

// MaxSLOTarget bounds a queue class's ttft and tpot: one hour.
const MaxSLOTarget = time.Hour

// Queue is the file's queue block: requests that cannot be placed because
// every candidate is at capacity wait here, served between classes by
// weighted deficit round robin and within a class by (priority, order).
//
//	queue {
//	  max_active_requests = 64      # per worker; a worker at it takes no more until one ends
//	  max_waiting         = 10000   # 0: unbounded
//	  aging               = "1s"    # a waiting request's priority rises by one per interval
//	  default_class       = "interactive"
//	  class "interactive" {
//	    weight = 3
//	    order  = "fcfs"
//	  }
//	  class "batch" {
//	    weight = 1
//	    order  = "wspt"
//	  }
//	  class "chat" {
//	    order   = "slack"
//	    ttft    = "500ms"     # latency targets of the class's requests (shared.SLO)
//	    tpot    = "50ms"
//	    on_miss = "wait"      # least-late, wait or reject
//	  }
//	}
type Queue struct {
	// MaxActiveRequests is each worker's capacity in in-flight requests;
	// 0 means no router-side capacity (nothing queues unless a busy filter
	// leaves no candidate).
	MaxActiveRequests int
	// MaxWaiting bounds the queue; a request beyond it is refused (429 in
	// serve, "rejected" in replay). 0 means unbounded.
	MaxWaiting int
	// Aging is how long a wait raises a request's priority by one; 0 is
	// strict priority, which can starve low priorities (the loader warns).
	Aging time.Duration
	// DefaultClass takes requests whose classification names no class (the
	// first class when unset).
	DefaultClass string
	// Classes in file order; at least one. Without a queue block the router
	// uses DefaultQueue.
	Classes []QueueClass
	// Range is the block's definition; zero for DefaultQueue.
	Range hcl.Range
}

// QueueClass is one `class "NAME" { weight order ttft tpot on_miss }` of
// the queue block.
type QueueClass struct {
	Name   string
	Weight int    // >= 1; default 1
	Order  string // OrderFCFS (default), OrderLCFS, OrderWSPT or OrderSlack
	// SLO is the latency targets of the class's requests (ttft, tpot:
	// durations from 0 to MaxSLOTarget, 0 for none; on_miss:
	// "least-late", "wait" or "reject", unset for the policy's choice);
	// a request's own targets (its headers) win field by field. Its
	// Waited is always 0.
	SLO   shared.SLO
	Range hcl.Range
}

// DefaultAging is the aging of a queue block that sets none, and of the
// default queue: one priority level per second keeps the worst-case wait
// of a low-priority request bounded by its priority gap in seconds.
const DefaultAging = time.Second

// DefaultQueue is the queue of a file without a queue block: one class
// "default", FCFS, no router-side capacity, aging DefaultAging.
func DefaultQueue() Queue {
	return Queue{Aging: DefaultAging, DefaultClass: "default", Classes: []QueueClass{{Name: "default", Weight: 1, Order: OrderFCFS}}}
}

var queueSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "max_active_requests"},
		{Name: "max_waiting"},
		{Name: "aging"},
		{Name: "default_class"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "class", LabelNames: []string{"name"}}},
}

var queueClassSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "weight"},
		{Name: "order"},
		{Name: "ttft"},
		{Name: "tpot"},
		{Name: "on_miss"},
	},
}

// queueBlock decodes the queue block into the PolicyFile.
func (l *loader) queueBlock(blk *hcl.Block) {
	q := Queue{Aging: DefaultAging, Range: blk.DefRange}
	errorsBefore := len(l.diags.Errs())
	defer func() { l.queueErrors = len(l.diags.Errs()) > errorsBefore }()
	content, diags := blk.Body.Content(queueSchema)
	l.diags = append(l.diags, diags...)
	for _, f := range []struct {
		name string
		dst  *int
	}{{"max_active_requests", &q.MaxActiveRequests}, {"max_waiting", &q.MaxWaiting}} {
		if attr, ok := content.Attributes[f.name]; ok {
			if n, ok := l.intAttr(attr); ok {
				if n < 0 || n > 1<<30 {
					l.attrErrorf(attr, "Invalid "+f.name, "%s must be between 0 (no limit) and %d, got %d.", f.name, 1<<30, n)
				} else {
					*f.dst = int(n)
				}
			}
		}
	}
	agingAttr, hasAging := content.Attributes["aging"]
	if hasAging {
		if d, ok := l.durationAttr(agingAttr); ok {
			if d < 0 {
				l.attrErrorf(agingAttr, "Invalid aging", "aging must be a duration >= 0 such as \"1s\" (0 is strict priority), got %q.", d.String())
			} else {
				q.Aging = d
			}
		}
	}
	seen := map[string]hcl.Range{}
	for _, cb := range content.Blocks {
		name := cb.Labels[0]
		if !l.checkName("queue class", name, cb.LabelRanges[0]) {
			continue
		}
		if first, dup := seen[name]; dup {
			l.errorf(cb.LabelRanges[0], "Duplicate queue class",
				"Queue class %q is already declared at %s; rename or remove one of them.", name, pos(first))
			continue
		}
		seen[name] = cb.DefRange
		c := QueueClass{Name: name, Weight: 1, Order: OrderFCFS, Range: cb.DefRange}
		cc, diags := cb.Body.Content(queueClassSchema)
		l.diags = append(l.diags, diags...)
		if attr, ok := cc.Attributes["weight"]; ok {
			if n, ok := l.intAttr(attr); ok {
				if n < 1 || n > 1<<20 {
					l.attrErrorf(attr, "Invalid weight", "A queue class weight must be an integer between 1 and %d, got %d.", 1<<20, n)
				} else {
					c.Weight = int(n)
				}
			}
		}
		if attr, ok := cc.Attributes["order"]; ok {
			if s, ok := l.stringAttr(attr); ok {
				switch s {
				case OrderFCFS, OrderLCFS, OrderWSPT, OrderSlack:
					c.Order = s
				default:
					l.attrErrorf(attr, "Invalid order", "order must be %q, %q, %q or %q, got %q.", OrderFCFS, OrderLCFS, OrderWSPT, OrderSlack, s)
				}
			}
		}
		for _, f := range []struct {
			name string
			dst  *time.Duration
		}{{"ttft", &c.SLO.TTFT}, {"tpot", &c.SLO.TPOT}} {
			if attr, ok := cc.Attributes[f.name]; ok {
				if d, ok := l.durationAttr(attr); ok {
					if d < 0 || d > MaxSLOTarget {
						l.attrErrorf(attr, "Invalid "+f.name, "%s must be a duration from \"0s\" (no target) to %q, got %q.", f.name, MaxSLOTarget.String(), d.String())
					} else {
						*f.dst = d
					}
				}
			}
		}
		if attr, ok := cc.Attributes["on_miss"]; ok {
			if s, ok := l.stringAttr(attr); ok {
				if m, ok := shared.ParseSLOMiss(s); ok {
					c.SLO.OnMiss = m
				} else {
					l.attrErrorf(attr, "Invalid on_miss", "on_miss must be %q, %q or %q, got %q.",
						shared.SLOMissLeastLate.String(), shared.SLOMissWait.String(), shared.SLOMissReject.String(), s)
				}
			}
		}
		q.Classes = append(q.Classes, c)
	}
	if len(q.Classes) == 0 && len(content.Blocks) == 0 {
		l.errorf(blk.DefRange, "Queue without classes",
			"A queue block needs at least one class, for example: class \"interactive\" { weight = 1 }.")
	}
	if attr, ok := content.Attributes["default_class"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			if _, known := seen[s]; !known && len(seen) > 0 {
				l.attrErrorf(attr, "Unknown queue class", "default_class names %q, which is not a class of this queue.", s)
			}
			q.DefaultClass = s
		}
	} else if len(q.Classes) > 0 {
		q.DefaultClass = q.Classes[0].Name
	}
	if q.Aging == 0 {
		subject := blk.DefRange
		if hasAging {
			subject = agingAttr.Range
		}
		l.warnf(subject, "Strict priority can starve requests",
			"With aging = \"0s\" a low-priority request waits as long as higher priorities keep arriving. Set aging (for example \"1s\") to bound every wait.")
	}
	l.file.Queue = q
}

// checkClassifierClasses reports each queue class the request classifier's
// parameters name (builtin.QueueClassNamer) that the file's queue lacks (the
// default queue's only class is "default"), at the parameter: admission
// would refuse every request so classified.
func (l *loader) checkClassifierClasses() {
	c, decl := l.file.Classifier, l.classifier
	if c == nil || c.Instance == nil || l.queueErrors {
		return
	}
	namer, ok := c.Instance.(builtin.QueueClassNamer)
	if !ok {
		return
	}
	param, classes := namer.QueueClasses()
	attr := decl.attrs[param]
	if attr == nil {
		return // a default, which names no class
	}
	q := &l.file.Queue
	for _, name := range classes {
		if slices.ContainsFunc(q.Classes, func(qc QueueClass) bool { return qc.Name == name }) {
			continue
		}
		where := "the queue block"
		if q.Range == (hcl.Range{}) {
			where = "the default queue (no queue block)"
		}
		l.attrErrorf(attr, "Unknown queue class",
			"%s names queue class %q, which %s does not have (classes: %s); every request so classified would be refused. Name one of them, or add class %q to the queue.",
			param, name, where, q.classNames(), name)
	}
}

// classNames lists q's class names, comma-separated, for messages.
func (q *Queue) classNames() string {
	names := make([]string, len(q.Classes))
	for i, c := range q.Classes {
		names[i] = c.Name
	}
	return strings.Join(names, ", ")
}

// String renders a queue for messages: "2 classes, aging 1s, max_active_requests 64"
// ("1 class, ..." for one).
func (q Queue) String() string {
	classes := "classes"
	if len(q.Classes) == 1 {
		classes = "class"
	}
	return fmt.Sprintf("%d %s, aging %s, max_active_requests %d", len(q.Classes), classes, q.Aging, q.MaxActiveRequests)
}
