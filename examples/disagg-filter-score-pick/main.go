// Command disagg-filter-score-pick is an example Switchyard plugin for
// disaggregated serving: the min-overlap filter, the prefill-cost and
// decode-cost scorers and the lowest-cost picker (package disagg), served
// out of process with shared.Serve. A policy made of these types runs in
// one Decide round trip per request.
//
// The router launches this binary itself from a `plugin` block; it never
// writes to stdout, which go-plugin owns. README.md documents the types.
package main

import (
	"github.com/switchyard-router/switchyard/examples/disagg-filter-score-pick/disagg"
	"github.com/switchyard-router/switchyard/shared"
)

// version is the plugin's own version, which Describe reports; set it at
// build time with -ldflags "-X main.version=v1.2.3".
var version = "0.1.0"

func main() {
	shared.Serve(shared.ServeOpts{
		Version: version,
		Types:   disagg.Types(),
	})
}
