package main

import (
	"fmt"
	"io"

	"github.com/switchyard-router/switchyard/router/trace"
)

// noteFailedRequests notes on w how many of tr's requests failed in the
// recording (trace.Record.FailedInRecording) and how replay treats them;
// nothing when none did.
func noteFailedRequests(w io.Writer, tr *trace.Opened) {
	if tr.Failed == 0 {
		return
	}
	fmt.Fprintf(w, "router: note: trace %s: %d of %d requests failed when the %s trace was recorded (Response tokens 0); "+
		"they are replayed as requests that generate no token (a BurstGPT_without_fails_*.csv file has none)\n",
		tr.Name, tr.Failed, tr.Requests, tr.Source)
}
