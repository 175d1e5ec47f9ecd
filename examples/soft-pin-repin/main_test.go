package main

import (
	"testing"

	"github.com/switchyard-router/switchyard/plugintest"
)

// TestConformance builds this plugin and runs it through every check of
// `router plugins check`; soft-pin's max_active_requests is required.
func TestConformance(t *testing.T) {
	plugintest.Check(t, plugintest.Build(t, "."), plugintest.Config("max_active_requests", "4"))
}
