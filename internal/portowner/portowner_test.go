package portowner

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestOfAFreePort: a port nothing listens on has no owner.
func TestOfAFreePort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Of reads /proc")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if got := Of(port); !strings.HasSuffix(got, fmt.Sprintf("(pid %d)", os.Getpid())) {
		t.Fatalf("Of(%d) while this test listens = %q", port, got)
	}
	ln.Close()
	if got := Of(port); got != "no process now" {
		t.Fatalf("Of(%d) after the close = %q, want %q", port, got, "no process now")
	}
}

// TestTakenNote: Go's bind error for a taken port names it and its
// owner (this test, which holds it); other text gives no note.
func TestTakenNote(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Of reads /proc")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = net.Listen("tcp", ln.Addr().String())
	if err == nil {
		t.Fatal("a second listener on a taken port")
	}
	port := ln.Addr().(*net.TCPAddr).Port
	comm, err2 := os.ReadFile("/proc/self/comm")
	if err2 != nil {
		t.Fatal(err2)
	}
	want := fmt.Sprintf("\nport %d is held by %s (pid %d)", port, strings.TrimSpace(string(comm)), os.Getpid())
	if got := TakenNote([]byte("error: " + err.Error() + "\n")); got != want {
		t.Errorf("TakenNote(%q) = %q, want %q", err, got, want)
	}
	if got := TakenNote([]byte("listen tcp 127.0.0.1:1: bind: permission denied")); got != "" {
		t.Errorf("TakenNote of another error = %q, want none", got)
	}
}
