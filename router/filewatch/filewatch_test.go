package filewatch

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// debounce is the tests' quiet period: long enough that a test's burst of
// file operations (microseconds apart on an idle machine) still falls
// within it when the test is descheduled for a while on a saturated one.
const debounce = 250 * time.Millisecond

// settle is how long a test waits to conclude that no change comes: a
// few quiet periods.
const settle = 4 * debounce

func watch(t *testing.T, path string) *Watcher {
	t.Helper()
	w, err := New(path, debounce)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	})
	return w
}

// oneChange waits (bounded) for a change, then checks that no second one
// follows it.
func oneChange(t *testing.T, w *Watcher, what string) {
	t.Helper()
	select {
	case <-w.Changes():
	case err := <-w.Errors():
		t.Fatalf("%s: error %v, want a change", what, err)
	case <-time.After(time.Minute):
		t.Fatalf("%s: no change within a minute", what)
	}
	noChange(t, w, what+" (a second change)")
}

func noChange(t *testing.T, w *Watcher, what string) {
	t.Helper()
	select {
	case <-w.Changes():
		t.Fatalf("%s: unexpected change", what)
	case err := <-w.Errors():
		t.Fatalf("%s: unexpected error %v", what, err)
	case <-time.After(settle):
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes content to a temporary file and renames it over path,
// as editors and deployment tools do.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	write(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// realDir is a t.TempDir with symlinks resolved, as the Watcher lists it.
func realDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// watched lists the watched directories.
func watched(w *Watcher) []string {
	l := w.fsw.WatchList()
	slices.Sort(l)
	return l
}

func TestInPlaceWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	write(t, path, "a = 2\n")
	oneChange(t, w, "in-place write")
}

func TestRenameOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	replace(t, path, "a = 2\n")
	oneChange(t, w, "rename over")
	replace(t, path, "a = 3\n")
	oneChange(t, w, "second rename over")
}

func TestBurstIsOneChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 0\n")
	w := watch(t, path)
	for i := 1; i <= 5; i++ {
		write(t, path, strings.Repeat("a = 1\n", i))
	}
	oneChange(t, w, "five writes within the debounce")
}

func TestSameContentIsNoChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)

	// touch
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	noChange(t, w, "touch")
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	noChange(t, w, "chmod")
	write(t, path, "a = 1\n")
	noChange(t, w, "rewrite with the same content")
	replace(t, path, "a = 1\n")
	noChange(t, w, "rename over with the same content")
	// Changed and changed back within the debounce: the settled content
	// is the same.
	write(t, path, "a = 2\n")
	write(t, path, "a = 1\n")
	noChange(t, w, "changed and back within the debounce")

	write(t, path, "a = 2\n")
	oneChange(t, w, "a real change after them")
}

func TestUnrelatedFileIsNoChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	other := filepath.Join(dir, "other.hcl")
	write(t, other, "b = 1\n")
	write(t, other, "b = 2\n")
	replace(t, other, "b = 3\n")
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	noChange(t, w, "another file in the directory")
}

// configMap builds kubelet's AtomicWriter layout in dir with content in
// the timestamped directory ts and returns the mounted file's path:
// dir/ts/policy.hcl, dir/..data -> ts, dir/policy.hcl -> ..data/policy.hcl.
func configMap(t *testing.T, dir, ts, content string) string {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, ts, "policy.hcl"), content)
	symlink(t, ts, filepath.Join(dir, "..data"))
	path := filepath.Join(dir, "policy.hcl")
	symlink(t, filepath.Join("..data", "policy.hcl"), path)
	return path
}

// swapConfigMap updates the layout as kubelet does: a new timestamped
// directory, ..data_tmp pointing at it renamed over ..data, the old
// directory removed. No step names policy.hcl.
func swapConfigMap(t *testing.T, dir, from, to, content string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, to), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, to, "policy.hcl"), content)
	symlink(t, to, filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, from)); err != nil {
		t.Fatal(err)
	}
}

func TestConfigMapSwap(t *testing.T) {
	dir := realDir(t)
	path := configMap(t, dir, "..2026_a", "v = 1\n")
	w := watch(t, path)
	if got, want := watched(w), []string{dir, filepath.Join(dir, "..2026_a")}; !slices.Equal(got, want) {
		t.Fatalf("watched %q, want %q", got, want)
	}

	swapConfigMap(t, dir, "..2026_a", "..2026_b", "v = 2\n")
	oneChange(t, w, "..data swap")
	if got := read(t, path); got != "v = 2\n" {
		t.Fatalf("after the swap the file reads %q", got)
	}
	// The new target's directory is watched, the removed one is not.
	if got, want := watched(w), []string{dir, filepath.Join(dir, "..2026_b")}; !slices.Equal(got, want) {
		t.Fatalf("watched %q after the swap, want %q", got, want)
	}
	// So an edit in place of the new target is seen (kubelet never does
	// it, but it shows the watch followed the swap).
	write(t, filepath.Join(dir, "..2026_b", "policy.hcl"), "v = 3\n")
	oneChange(t, w, "edit of the new target")

	// A swap to the same content is no change.
	swapConfigMap(t, dir, "..2026_b", "..2026_c", "v = 3\n")
	noChange(t, w, "swap to the same content")

	swapConfigMap(t, dir, "..2026_c", "..2026_d", "v = 4\n")
	oneChange(t, w, "second swap")
	if got := read(t, path); got != "v = 4\n" {
		t.Fatalf("after the second swap the file reads %q", got)
	}
}

func TestSymlinkToAnotherDirectory(t *testing.T) {
	linkDir, targetDir, otherDir := realDir(t), realDir(t), realDir(t)
	target := filepath.Join(targetDir, "real.hcl")
	write(t, target, "a = 1\n")
	path := filepath.Join(linkDir, "policy.hcl")
	symlink(t, target, path)
	w := watch(t, path)

	write(t, target, "a = 2\n")
	oneChange(t, w, "in-place edit of the target")
	if got := read(t, path); got != "a = 2\n" {
		t.Fatalf("the link reads %q", got)
	}

	// Retargeted (by renaming a new link over it): a change, the new
	// target's directory is watched and the old one is not.
	other := filepath.Join(otherDir, "other.hcl")
	write(t, other, "b = 1\n")
	symlink(t, other, path+".new")
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	oneChange(t, w, "retarget")
	if got, want := watched(w), []string{linkDir, otherDir}; !slices.Equal(got, want) {
		t.Fatalf("watched %q after the retarget, want %q", got, want)
	}
	write(t, other, "b = 2\n")
	oneChange(t, w, "in-place edit of the new target")
	write(t, target, "a = 3\n")
	noChange(t, w, "edit of the former target")
}

func TestSymlinkChain(t *testing.T) {
	// path -> hop/link -> final/real.hcl: the middle link's directory is
	// watched too, so its retarget is seen.
	linkDir, hopDir, finalDir := realDir(t), realDir(t), realDir(t)
	real1 := filepath.Join(finalDir, "real1.hcl")
	real2 := filepath.Join(finalDir, "real2.hcl")
	write(t, real1, "a = 1\n")
	write(t, real2, "a = 2\n")
	hop := filepath.Join(hopDir, "link.hcl")
	symlink(t, real1, hop)
	path := filepath.Join(linkDir, "policy.hcl")
	symlink(t, hop, path)
	w := watch(t, path)
	if got, want := watched(w), []string{linkDir, hopDir, finalDir}; !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("watched %q, want %q", got, want)
	}
	if err := os.Remove(hop); err != nil {
		t.Fatal(err)
	}
	symlink(t, real2, hop)
	oneChange(t, w, "retarget of the middle link")
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestDeleteAndRecreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	oneChange(t, w, "delete")
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat after delete: %v", err)
	}
	write(t, path, "a = 1\n")
	oneChange(t, w, "recreate (same content as before the delete)")
}

func TestMissingAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	w := watch(t, path)
	write(t, path, "")
	oneChange(t, w, "an empty file appears")
}

func TestUnreadableIsAnErrorNotAChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w := watch(t, path)
	// A directory in its place cannot be read (also as root).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.Errors():
		if !strings.Contains(err.Error(), path) || errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("error %q: want one naming %s, not a missing file", err, path)
		}
	case <-w.Changes():
		t.Fatal("an unreadable file is a change")
	case <-time.After(time.Minute):
		t.Fatal("no error within 5 s")
	}
	// Back with the content it had: compared with the last read, no change.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	write(t, path, "a = 1\n")
	noChange(t, w, "the same content back")
	write(t, path, "a = 2\n")
	oneChange(t, w, "new content")
}

func TestNewErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "policy.hcl")
	w, err := New(path, 0)
	if err == nil {
		_ = w.Close()
		t.Fatal("New of a file in a missing directory succeeded")
	}
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q: want fs.ErrNotExist, naming %s", err, path)
	}
}

func TestDefaults(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	w, err := New("policy.hcl", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if w.debounce != DefaultDebounce {
		t.Errorf("debounce %v, want %v", w.debounce, DefaultDebounce)
	}
	if want := filepath.Join(dir, "policy.hcl"); w.Path() != want {
		t.Errorf("Path() = %q, want %q", w.Path(), want)
	}
	if cap(w.Changes()) != 1 || cap(w.Errors()) != ErrorBuffer {
		t.Errorf("capacities %d, %d; want 1, %d", cap(w.Changes()), cap(w.Errors()), ErrorBuffer)
	}
}

func TestClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.hcl")
	write(t, path, "a = 1\n")
	w, err := New(path, debounce)
	if err != nil {
		t.Fatal(err)
	}
	// A change is pending in the debounce when Close is called.
	write(t, path, "a = 2\n")
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within 5 s")
	}
	select {
	case <-w.stopped:
	default:
		t.Fatal("Close returned before the goroutine ended")
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select { // one the goroutine sent before Close, if it was that quick
	case <-w.Changes():
	default:
	}
	write(t, path, "a = 3\n")
	select {
	case <-w.Changes():
		t.Fatal("a change after Close")
	case <-time.After(settle):
	}
	// TestMain's goleak check covers the fsnotify goroutines as well.
}
