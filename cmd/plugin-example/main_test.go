package main

import (
	"testing"

	"github.com/switchyard-router/switchyard/plugintest"
)

// TestConformance builds this plugin and runs it through every check of
// `router plugins check` (docs/plugin-protocol.md, section 9): keep it
// when you copy this directory.
func TestConformance(t *testing.T) {
	plugintest.Check(t, plugintest.Build(t, "."))
}
