package benchproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/switchyard-router/switchyard/internal/portowner"
)

// helperEnv makes the test binary a child for Start: "listen ADDR" binds
// ADDR and prints "helper listening on http://BOUND" then "helper second
// on tcp://BOUND" (a second listener on port 0), then blocks until
// stopped; a bind error goes to stderr as Go writes it, exit 1.
const helperEnv = "BENCHPROC_TEST_HELPER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		ln2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		// The second line first: StartAll takes them in any order.
		fmt.Printf("helper second on tcp://%s\n", ln2.Addr())
		fmt.Printf("helper listening on http://%s\n", ln.Addr())
		select {}
	}
	os.Exit(m.Run())
}

func startHelper(t *testing.T, cs *Children, addr string) ([]string, error) {
	t.Helper()
	t.Setenv(helperEnv, addr)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return cs.StartAll(context.Background(), filepath.Join(t.TempDir(), "helper.log"),
		[]*regexp.Regexp{regexp.MustCompile(`helper listening on http://(\S+)`), regexp.MustCompile(`helper second on (tcp://\S+)`)},
		exe, "-test.run=^$")
}

// TestStartAllReadsEachAddress: a child on port 0 reports both addresses
// it bound, in the order asked for, and they are its sockets.
func TestStartAllReadsEachAddress(t *testing.T) {
	var cs Children
	defer cs.StopAll()
	got, err := startHelper(t, &cs, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got[1], "tcp://127.0.0.1:") || strings.HasSuffix(got[0], ":0") {
		t.Fatalf("StartAll = %q, want [127.0.0.1:PORT tcp://127.0.0.1:PORT]", got)
	}
	pid, ok := cs.Pid(got[0])
	if !ok {
		t.Fatalf("no child known by %s", got[0])
	}
	_, port, _ := net.SplitHostPort(got[0])
	if runtime.GOOS == "linux" {
		var p int
		fmt.Sscan(port, &p)
		if owner := portowner.Of(p); !strings.HasSuffix(owner, fmt.Sprintf("(pid %d)", pid)) {
			t.Fatalf("portowner.Of(%d) = %q, want the child, pid %d", p, owner, pid)
		}
	}
}

// TestStartNamesTheTakenPortsOwner: a child whose fixed port is taken
// fails with an error naming the port and the process holding it (this
// test's).
func TestStartNamesTheTakenPortsOwner(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("portowner.Of reads /proc")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	var cs Children
	defer cs.StopAll()
	_, err = startHelper(t, &cs, ln.Addr().String())
	want := fmt.Sprintf("port %d is held by %s (pid %d)", port, strings.TrimSpace(string(comm)), os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("StartAll on a taken port: %v, want it to say %q", err, want)
	}
}
