// Command plugin-example is the smallest useful Switchyard plugin, written
// as the template a plugin author copies: one scorer type, queue-depth (see
// package queuedepth), served out of process with shared.Serve.
//
// The router launches this binary itself (a `plugin` block in a policy
// file); run by hand it exits with a message, because it only speaks
// go-plugin's handshake. It never writes to stdout, which go-plugin owns;
// logs go to stderr.
//
// README.md walks from copying this directory to a policy that uses it.
package main

import (
	"github.com/switchyard-router/switchyard/cmd/plugin-example/queuedepth"
	"github.com/switchyard-router/switchyard/shared"
)

// version is the plugin's own version, which Describe reports; set it at
// build time with -ldflags "-X main.version=v1.2.3".
var version = "0.1.0"

func main() {
	shared.Serve(shared.ServeOpts{
		Version: version,
		Types:   queuedepth.Types(),
	})
}
