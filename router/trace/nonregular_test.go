//go:build unix

package trace

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile"
)

// TestReadFileRefusesAPipe: a named pipe with no writer is refused by
// name; opening it to read would block for ever.
func TestReadFileRefusesAPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "t.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ReadFile(fifo)
		done <- err
	}()
	select {
	case err := <-done:
		if want := fifo + " is a named pipe (FIFO), not a regular file"; !errors.Is(err, inputfile.ErrNotRegular) || err.Error() != want {
			t.Fatalf("ReadFile: %v, want %q", err, want)
		}
	case <-time.After(time.Minute): // a safety net, not a speed check
		t.Fatal("ReadFile of a FIFO did not return")
	}
}
