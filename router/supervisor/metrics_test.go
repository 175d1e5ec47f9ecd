package supervisor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router/pipeline"
)

// TestDecideTasksPerMessage: decisions that queue while a DecideBatch is
// being sent to a real plugin process share the next message, and
// switchyard_plugin_decide_tasks_per_message observes each message's
// tasks. The first message's observation holds the client's sender until
// the other queued decisions are all pending, so the messages are exactly
// one of 1 task, then one of all the others.
func TestDecideTasksPerMessage(t *testing.T) {
	const queued = 8
	h, reg := faultHost(t, Options{})
	var (
		mu    sync.Mutex
		sizes []int
	)
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	h.testHookDecideBatch = func(tasks int) {
		mu.Lock()
		sizes = append(sizes, tasks)
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			close(entered)
			<-release
		}
	}
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before Shutdown, which waits for the sender
	cp := startPolicy(t, h, block("batch", ""))
	decide := func() error {
		c := candidates()
		row, err := pipeline.Execute(context.Background(), cp, request, c, &pipeline.Scratch{})
		if err == nil && c.IDs[row] != 11 {
			t.Errorf("picked worker %d, want 11", c.IDs[row])
		}
		return err
	}
	errs := make(chan error, queued+1)
	go func() { errs <- decide() }()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("no DecideBatch sent a minute after the first decision")
	}
	for range queued {
		go func() { errs <- decide() }()
	}
	rc := runningProc(h, "batch").rc
	if !testkit.Poll(time.Minute, func() bool { return rc.Pending() == queued+1 }) {
		t.Fatalf("%d decisions pending a minute after %d started", rc.Pending(), queued+1)
	}
	releaseOnce.Do(func() { close(release) })
	for range queued + 1 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	mu.Lock()
	got := append([]int(nil), sizes...)
	mu.Unlock()
	if len(got) != 2 || got[0] != 1 || got[1] != queued {
		t.Errorf("DecideBatch sizes %v, want [1 %d]", got, queued)
	}
	want := `
# HELP switchyard_plugin_decide_tasks_per_message Decision tasks in each DecideBatch message sent to the plugin: decisions that queue while one is being sent share the next (batching under load, no timer).
# TYPE switchyard_plugin_decide_tasks_per_message histogram
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="1"} 1
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="2"} 1
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="4"} 1
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="8"} 2
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="16"} 2
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="32"} 2
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="64"} 2
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="128"} 2
switchyard_plugin_decide_tasks_per_message_bucket{plugin="batch",le="+Inf"} 2
switchyard_plugin_decide_tasks_per_message_sum{plugin="batch"} 9
switchyard_plugin_decide_tasks_per_message_count{plugin="batch"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "switchyard_plugin_decide_tasks_per_message"); err != nil {
		t.Error(err)
	}
}
