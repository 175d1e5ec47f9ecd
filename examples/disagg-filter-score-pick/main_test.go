package main

import (
	"testing"

	"github.com/switchyard-router/switchyard/plugintest"
	"github.com/switchyard-router/switchyard/shared"
)

// TestConformance builds this plugin and runs it through every check of
// `router plugins check`, for each role its types serve: lowest-cost
// picks prefill workers only, decode-cost scores decode workers.
func TestConformance(t *testing.T) {
	bin := plugintest.Build(t, ".")
	for _, role := range []shared.Role{shared.RolePrefill, shared.RoleDecode} {
		t.Run(string(role), func(t *testing.T) {
			plugintest.Check(t, bin, plugintest.Role(role), plugintest.Config("min_device_overlap_blocks", "0"))
		})
	}
}
