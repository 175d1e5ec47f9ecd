// Command soft-pin-repin is an example Switchyard plugin: the soft-pin
// picker (package softpin), which keeps a session on its worker while that
// worker is not overloaded and re-pins it elsewhere when it is, served out
// of process with shared.Serve. The pins live in this process, so they
// survive as long as the plugin process does (a restart forgets them).
//
// The router launches this binary itself from a `plugin` block; it never
// writes to stdout, which go-plugin owns. README.md documents the type.
package main

import (
	"github.com/switchyard-router/switchyard/examples/soft-pin-repin/softpin"
	"github.com/switchyard-router/switchyard/shared"
)

// version is the plugin's own version, which Describe reports; set it at
// build time with -ldflags "-X main.version=v1.2.3".
var version = "0.1.0"

func main() {
	shared.Serve(shared.ServeOpts{
		Version: version,
		Types:   softpin.Types(),
	})
}
