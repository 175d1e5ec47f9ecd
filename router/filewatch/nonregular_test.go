//go:build unix

package filewatch

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/inputfile/inputfiletest"
)

// TestNotARegularFileIsAnErrorNotAChange: a named pipe with no writer in
// the file's place (a read of it would block forever) and a file over
// inputfile.MaxConfigSize are errors naming the file, not changes, and the
// Watcher goes on: it sees the next real change and closes.
func TestNotARegularFileIsAnErrorNotAChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	wantErr := func(sentinel error, want string) {
		t.Helper()
		select {
		case err := <-w.Errors():
			if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q, want %v and %q", err, sentinel, want)
			}
		case <-w.Changes():
			t.Fatalf("a change, want the error %q", want)
		case <-time.After(30 * time.Second):
			t.Fatalf("no error within 30 s, want %q", want)
		}
	}

	// Each replacement is made in another directory and renamed over the
	// file, so that the Watcher never reads it half made.
	staging := t.TempDir()
	if err := os.Rename(inputfiletest.FIFO(t, staging, "fifo"), path); err != nil {
		t.Fatal(err)
	}
	wantErr(inputfile.ErrNotRegular, path+" is a named pipe (FIFO), not a regular file")

	big := filepath.Join(staging, "big")
	write(t, big, string(bytes.Repeat([]byte("#"), inputfile.MaxConfigSize+1)))
	if err := os.Rename(big, path); err != nil {
		t.Fatal(err)
	}
	wantErr(inputfile.ErrTooLarge, path+": file too large: over the 4 MiB limit")

	// While it stays too large, other events in its directory (a log
	// written beside it) read it again but report nothing new.
	for i := range 3 {
		write(t, filepath.Join(filepath.Dir(path), "serve.log"), strings.Repeat("warn\n", i+1))
		noChange(t, w, "a log written beside the oversized file")
	}

	write(t, path, "a = 2\n")
	oneChange(t, w, "a regular file with new content")

	// After a good read the same error is news again.
	if err := os.Rename(inputfiletest.FIFO(t, staging, "fifo2"), path); err != nil {
		t.Fatal(err)
	}
	wantErr(inputfile.ErrNotRegular, path+" is a named pipe (FIFO), not a regular file")
}
