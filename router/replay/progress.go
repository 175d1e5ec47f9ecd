package replay

import "time"

// Progress is a snapshot of a replay under way, handed to
// Options.Progress. Every field is in simulated terms: a replay never
// reads the wall clock for it.
type Progress struct {
	// Retired is the number of requests over and written (to
	// Options.PerRequest) and tallied, in trace order.
	Retired int
	// Arrived is the number of requests that have arrived so far
	// (Retired <= Arrived).
	Arrived int
	// Total is the number of requests in the trace when the replay knows
	// it (Options.Records is set: len(Records)); 0 for a stream
	// (Options.Trace), whose length is known only at its end.
	Total int
	// SimTime is the simulated time since the first request's arrival
	// (0 before it arrives).
	SimTime time.Duration
}

// progressEvery is how many driver loop iterations pass between two calls
// of Options.Progress: rare enough that the call costs nothing measurable
// (see BENCHMARKS.md), often enough for a display (a loop iteration is
// one arrival or one simulated instant).
const progressEvery = 1024

// notify hands the current Progress to the Options.Progress hook, if any.
func (d *driver) notify() {
	if d.progress == nil {
		return
	}
	p := Progress{Retired: d.lo, Arrived: d.next, Total: d.total}
	if d.next > 0 {
		p.SimTime = d.now - d.firstArrival
	}
	d.progress(p)
}
