package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonTestingCheck: the Python SDK's switchyard_plugin.testing.check
// runs `router plugins check` on a Python plugin from a unittest (the
// tests of sdk/python/tests/test_testing.py, here with the router built and
// required: a missing router fails them rather than skipping): the example
// scorer passes with a replay, a scorer that raises fails with the routing
// reason, and a declared p99 over call_timeout warns.
func TestPythonTestingCheck(t *testing.T) {
	pythonExample(t) // the SDK's dependencies
	routerBin, _ := e2eBinaries(t)
	sdk, err := filepath.Abs("../../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pythonBin, "-m", "unittest", "-v", "tests.test_testing")
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(), "SWITCHYARD_ROUTER="+routerBin, "SWITCHYARD_REQUIRE_ROUTER=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python3 -m unittest tests.test_testing: %v\n%s", err, out)
	}
}
