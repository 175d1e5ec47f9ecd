// Command dieafter is a test plugin: the template plugin's queue-depth
// scorer, except that on its first start it SIGKILLs itself after serving
// DIE_AFTER scoring calls, as `kill -9` part way through a replay would.
// STARTS names a file it appends a line to at every start.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/switchyard-router/switchyard/cmd/plugin-example/queuedepth"
	"github.com/switchyard-router/switchyard/shared"
)

func main() {
	first := true
	if f := os.Getenv("STARTS"); f != "" {
		if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
			first = false
		}
		out, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, _ = fmt.Fprintln(out, os.Getpid())
			_ = out.Close()
		}
	}
	limit, _ := strconv.ParseInt(os.Getenv("DIE_AFTER"), 10, 64)
	t := queuedepth.QueueDepthType()
	inner := t.New
	t.New = func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
		c, err := inner(info, p)
		if err != nil || !first || limit <= 0 {
			return c, err
		}
		return &dying{Scorer: c.(shared.Scorer), limit: limit}, nil
	}
	shared.Serve(shared.ServeOpts{Version: "test", Types: []shared.TypeInfo{t}})
}

// dying scores like the scorer it wraps until it has served limit calls.
type dying struct {
	shared.Scorer
	limit int64
	calls atomic.Int64
}

func (d *dying) Score(ctx context.Context, req *shared.Request, c *shared.Candidates, costs []float64) error {
	if d.calls.Add(1) > d.limit {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return d.Scorer.Score(ctx, req, c, costs)
}
