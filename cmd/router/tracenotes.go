package main

import (
	"fmt"
	"io"

	"github.com/switchyard-router/switchyard/router/trace"
)

// note counts rec, a request replayed, into tr's prefix hashes, family
// and failed requests.
func (tr *replayTrace) note(rec *trace.Record) {
	tr.hashes = tr.hashes || len(rec.HashIDs) > 0
	tr.source = rec.Source
	if failedInRecording(rec) {
		tr.failed++
	}
}

// failedInRecording reports whether rec is a request that failed when the
// trace was recorded: in a BurstGPT trace, one with Response tokens 0
// (HPMLL/BurstGPT README: BurstGPT_*.csv holds "some failure that
// Response tokens are 0s"; BurstGPT_without_fails_*.csv drops them).
// Replay keeps such a request, as one that generates no token: it arrived
// and was routed, and dropping it would change the arrivals.
func failedInRecording(rec *trace.Record) bool {
	return rec.Source == trace.SourceBurstGPT && rec.OutputLength == 0
}

// noteFailedRequests notes on w how many of tr's requests failed in the
// recording and how replay treats them; nothing when none did.
func noteFailedRequests(w io.Writer, tr *replayTrace) {
	if tr.failed == 0 {
		return
	}
	fmt.Fprintf(w, "router: note: trace %s: %d of %d requests failed when the %s trace was recorded (Response tokens 0); "+
		"they are replayed as requests that generate no token (a BurstGPT_without_fails_*.csv file has none)\n",
		tr.name, tr.failed, tr.requests, tr.source)
}
