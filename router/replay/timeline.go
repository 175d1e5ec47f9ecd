package replay

import (
	"time"

	"github.com/switchyard-router/switchyard/router/replay/report"
)

// firstTimelineInterval is the Timeline's first interval width.
const firstTimelineInterval = 100 * time.Millisecond

// timeline samples a replay's state as simulated time passes. Its
// callers call advance(t) before every change at simulated time t, which
// never decreases: the state it holds is then the state up to t, and
// every interval that ended by t is closed with it.
type timeline struct {
	started  bool
	start    time.Duration // the first arrival
	interval time.Duration
	end      time.Duration // the open interval's end
	// inFlight and waiting are each fleet worker's engine counts, as last
	// observed; engineWaiting their total of waiting; routerQueue the
	// router's queue.
	inFlight, waiting []int32
	engineWaiting     int64
	routerQueue       int32
	// cur is the open interval's flows.
	cur [4]int64 // prompt, cached, reference prompt, reference hit
	// The closed samples: inFlightS holds len(workers) values per sample.
	inFlightS              []int32
	routerQueueS, engineQS []int32
	flows                  [4][]int64
}

func newTimeline(workers int) *timeline {
	return &timeline{interval: firstTimelineInterval, inFlight: make([]int32, workers), waiting: make([]int32, workers)}
}

// advance closes every interval that ends at or before t.
func (tl *timeline) advance(t time.Duration) {
	if tl == nil {
		return
	}
	if !tl.started {
		tl.started, tl.start, tl.end = true, t, t+tl.interval
	}
	for t >= tl.end {
		tl.close()
		tl.end += tl.interval
	}
}

// close appends the open interval as a sample and opens the next, merging
// samples pairwise (doubling the interval) when they reach the bound.
func (tl *timeline) close() {
	tl.inFlightS = append(tl.inFlightS, tl.inFlight...)
	tl.routerQueueS = append(tl.routerQueueS, tl.routerQueue)
	tl.engineQS = append(tl.engineQS, int32(tl.engineWaiting))
	for k := range tl.flows {
		tl.flows[k] = append(tl.flows[k], tl.cur[k])
		tl.cur[k] = 0
	}
	if len(tl.routerQueueS) < report.MaxTimelineSamples {
		return
	}
	// Merge pairs: states at the end of the pair's second interval, flows
	// summed. MaxTimelineSamples is even, so no sample is left alone.
	n, w := len(tl.routerQueueS)/2, len(tl.inFlight)
	for j := range n {
		copy(tl.inFlightS[j*w:(j+1)*w], tl.inFlightS[(2*j+1)*w:(2*j+2)*w])
		tl.routerQueueS[j] = tl.routerQueueS[2*j+1]
		tl.engineQS[j] = tl.engineQS[2*j+1]
		for k := range tl.flows {
			tl.flows[k][j] = tl.flows[k][2*j] + tl.flows[k][2*j+1]
		}
	}
	tl.inFlightS = tl.inFlightS[:n*w]
	tl.routerQueueS, tl.engineQS = tl.routerQueueS[:n], tl.engineQS[:n]
	for k := range tl.flows {
		tl.flows[k] = tl.flows[k][:n]
	}
	// The samples closed so far cover whole doubled intervals: the next
	// one opens at end, as wide as two.
	tl.interval *= 2
}

// worker records fleet worker id's engine counts at t.
func (tl *timeline) worker(t time.Duration, id, running, waiting int) {
	if tl == nil {
		return
	}
	tl.advance(t)
	tl.inFlight[id] = int32(running + waiting)
	tl.engineWaiting += int64(waiting) - int64(tl.waiting[id])
	tl.waiting[id] = int32(waiting)
}

// queue records the router's queue length at t.
func (tl *timeline) queue(t time.Duration, n int) {
	if tl == nil {
		return
	}
	tl.advance(t)
	tl.routerQueue = int32(n)
}

// firstToken adds a request's first token at t.
func (tl *timeline) firstToken(t time.Duration, prompt, cached int) {
	if tl == nil {
		return
	}
	tl.advance(t)
	tl.cur[0] += int64(prompt)
	tl.cur[1] += int64(cached)
}

// arrival adds a request arriving at t, with the KV reference's prompt
// and hit tokens for it.
func (tl *timeline) arrival(t time.Duration, prompt, hit int64) {
	if tl == nil {
		return
	}
	tl.advance(t)
	tl.cur[2] += prompt
	tl.cur[3] += hit
}

// result closes the interval open at t (the last completion) and returns
// the samples; nil when nothing arrived.
func (tl *timeline) result(t time.Duration) *report.Timeline {
	if tl == nil || !tl.started {
		return nil
	}
	tl.advance(t)
	tl.close()
	w := len(tl.inFlight)
	out := &report.Timeline{
		IntervalS:             tl.interval.Seconds(),
		InFlight:              make([][]int32, len(tl.routerQueueS)),
		RouterQueue:           tl.routerQueueS,
		EngineQueue:           tl.engineQS,
		PromptTokens:          tl.flows[0],
		CachedTokens:          tl.flows[1],
		ReferencePromptTokens: tl.flows[2],
		ReferenceHitTokens:    tl.flows[3],
	}
	for k := range out.InFlight {
		out.InFlight[k] = tl.inFlightS[k*w : (k+1)*w : (k+1)*w]
	}
	return out
}
