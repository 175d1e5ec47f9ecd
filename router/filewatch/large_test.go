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
)

// NewLarge watches a file over New's 4 MiB (a plugin binary): a content
// change is one change, a touch or an unchanged rewrite none, a rename
// over it is seen, and a file over its own limit is an error, not a
// change.
func TestNewLarge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugin")
	big := bytes.Repeat([]byte("x"), inputfile.MaxConfigSize+1)
	if err := os.WriteFile(path, big, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := NewLarge(path, debounce, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	})
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	noChange(t, w, "touch")
	if err := os.WriteFile(path, big, 0o755); err != nil {
		t.Fatal(err)
	}
	noChange(t, w, "rewrite with the same content")

	big[len(big)/2] = 'y' // same size
	if err := os.WriteFile(path, big, 0o755); err != nil {
		t.Fatal(err)
	}
	oneChange(t, w, "one byte changed in place")
	replace(t, path, "#!/bin/sh\n")
	oneChange(t, w, "renamed over")

	if err := os.WriteFile(path, bytes.Repeat([]byte("z"), 8<<20+1), 0o755); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.Errors():
		if !errors.Is(err, inputfile.ErrTooLarge) || !strings.Contains(err.Error(), path+": file too large: over the 8 MiB limit") {
			t.Errorf("error %v, want the file too large over 8 MiB", err)
		}
	case <-w.Changes():
		t.Fatal("a file over the limit is a change")
	case <-time.After(time.Minute):
		t.Fatal("no error within a minute for a file over the limit")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	oneChange(t, w, "removed")
}
