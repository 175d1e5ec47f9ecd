// Package filewatch tells its user when a file's content changed: the
// file watch behind `router serve --watch` (the policy file), the workers
// file of `router serve --workers-file` and workers.Manager.Watch.
//
// A Watcher does not decide from the names in file-system events whether
// the file changed, since the usual ways a deployed config file changes
// do not name it: an editor writes a temporary file and renames it over
// the file; a symlinked file's target, in another directory, is edited;
// and a Kubernetes ConfigMap or Secret volume is updated by kubelet's
// AtomicWriter, for which the mounted file (dir/policy.hcl) is a symlink
// to ..data/policy.hcl, ..data a symlink to a timestamped directory
// (dir/..2026_01_02_15_04_05.123456789), and an update writes a new
// timestamped directory, points a new symlink ..data_tmp at it and renames
// ..data_tmp over ..data: no event ever names policy.hcl. Instead any event
// in a watched directory makes the Watcher, once the events have settled,
// read the file and compare its content with what it read before.
package filewatch

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/switchyard-router/switchyard/router/inputfile"
)

// DefaultDebounce is the quiet period New uses when given a debounce <= 0:
// the file is read once no event arrived in a watched directory for this
// long, so a burst (an editor's truncate, write, write, chmod; a
// write-and-rename; kubelet's several steps) is read once, finished.
const DefaultDebounce = 100 * time.Millisecond

// ErrorBuffer is the capacity of a Watcher's Errors channel. An error that
// arrives while that many are unread is dropped, so a Watcher never
// blocks on a user that does not read Errors.
const ErrorBuffer = 8

// maxHops bounds the symlink chain New and the Watcher follow (the Linux
// kernel's own limit is 40).
const maxHops = 40

// Watcher reports changes of one file's content on its Changes channel.
//
// What counts as a change: the file's content (read following symlinks;
// its SHA-256) differs from when the Watcher last read it, or the file
// appeared or disappeared (a file that cannot be found is a state of its
// own, "absent"; a later file of any content is a change from it, even an
// empty one). Metadata alone (touch, chmod, an unchanged rewrite) and
// other files are not a change. A file that exists but cannot be read (a
// permission error, say, or one that is not a regular file or is larger
// than inputfile.MaxConfigSize: the file is read as the policy and workers
// loaders read it) is not a change: the error goes to Errors and the next
// successful read is compared with the last one.
//
// What is watched: the directory holding the path, the directory of each
// symlink the path leads through, and the directory of the path's fully
// resolved target (filepath.EvalSymlinks). The first sees editors'
// rename-over and the Kubernetes AtomicWriter `..data` symlink swap
// (both are events in the path's directory that do not name the file);
// the target's directory sees an in-place edit of a symlinked file that
// lives elsewhere. The set is resolved again before each read, so after a
// ConfigMap swap or a symlink retarget the new target's directory is
// watched and the old one, if no longer on the way, is not.
//
// A Watcher's methods are safe for concurrent use.
type Watcher struct {
	path     string // absolute, clean
	home     string // path's directory, symlinks resolved; always watched
	debounce time.Duration
	fsw      *fsnotify.Watcher
	changes  chan struct{}
	errs     chan error
	done     chan struct{}
	stopped  chan struct{}
	close    sync.Once
	closeErr error

	// limit, when > 0, makes read hash the file as it streams, up to limit
	// bytes, and reuse the last fingerprint while the file's identity,
	// size and modification time stay (NewLarge); 0 reads it whole, up to
	// inputfile.MaxConfigSize (New).
	limit int64

	// Owned by run once New returns.
	last fingerprint
	// lastStat is the file's stat when last hashed (NewLarge only).
	lastStat statKey
	// readErr is the text of the last failed read's error, "" after a
	// successful one: a file that stays unreadable is reported once, not
	// at every event in its directory (a log written beside it would
	// otherwise feed the watch its own warnings).
	readErr string
}

// fingerprint is what a read of the file saw.
type fingerprint struct {
	state state
	sum   [sha256.Size]byte
}

type state uint8

const (
	unknown state = iota // never read successfully: differs from everything
	absent
	present
)

func (a fingerprint) differs(b fingerprint) bool {
	return a.state == unknown || b.state == unknown || a != b
}

// New watches the file at path (relative to the working directory when
// not absolute) and returns its Watcher, whose goroutine runs until Close.
// The fingerprint the first change is compared with is taken here, before
// New returns: a change made after New returns is reported, also one made
// before the user first reads Changes.
//
// debounce is the quiet period: the file is read once no event arrived in
// a watched directory for that long (DefaultDebounce when <= 0). Events of
// other files in a watched directory count too, so a directory that never
// stays quiet for debounce delays the read.
//
// The file need not exist (its appearance is a change), but its directory
// must: New fails when that cannot be watched. Its errors name the path
// and wrap the cause.
func New(path string, debounce time.Duration) (*Watcher, error) {
	return newWatcher(path, debounce, 0)
}

// NewLarge is New for a file that may be large, such as a plugin's
// executable (router/live watches a policy's plugin files with it): the
// file is hashed as it is read, never held whole in memory, up to limit
// bytes (a larger file is a read error, sent to Errors, not a change),
// and it is hashed again only when its inode, size or modification time
// changed since the last hash, so the events of a busy directory cost a
// stat each. limit <= 0 means inputfile.MaxConfigSize.
func NewLarge(path string, debounce time.Duration, limit int64) (*Watcher, error) {
	if limit <= 0 {
		limit = inputfile.MaxConfigSize
	}
	return newWatcher(path, debounce, limit)
}

func newWatcher(path string, debounce time.Duration, limit int64) (*Watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("filewatch: watching %s: %w", path, err)
	}
	abs = filepath.Clean(abs)
	home, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return nil, fmt.Errorf("filewatch: watching %s: %w", abs, err)
	}
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("filewatch: watching %s: %w", abs, err)
	}
	w := &Watcher{
		path:     abs,
		limit:    limit,
		home:     home,
		debounce: debounce,
		fsw:      fsw,
		changes:  make(chan struct{}, 1),
		errs:     make(chan error, ErrorBuffer),
		done:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	if err := fsw.Add(home); err != nil {
		_ = fsw.Close()
		return nil, fmt.Errorf("filewatch: watching %s: directory %s: %w", abs, home, err)
	}
	// The directories first, then the read: a change after the read is an
	// event in a watched directory.
	w.rewatch()
	if fp, err := w.read(); err == nil {
		w.last = fp
	} else {
		w.readErr = err.Error()
		w.sendErr(err)
	}
	go w.run()
	return w, nil
}

// Path is the watched file's absolute path.
func (w *Watcher) Path() string { return w.path }

// Changes receives a value after each settled change of the file's
// content (see Watcher). It has capacity 1 and changes coalesce: changes
// made while a value is unread make that one value, so a reader that
// reads the file after receiving always sees the latest content. It is
// never closed; stop selecting on it after Close.
func (w *Watcher) Changes() <-chan struct{} { return w.changes }

// Errors receives the errors of the watch: the file-system notification's
// own (an event queue overflow, say; the Watcher then reads the file
// anyway, since events may have been lost), a directory that could not be
// watched, and a file that exists but cannot be read. Each names the path
// and wraps its cause. A read error is sent once while it stays the same:
// again only after it changed or a read succeeded. It is buffered (ErrorBuffer) and never blocks the
// Watcher: errors that arrive while it is full are dropped. It is never
// closed.
func (w *Watcher) Errors() <-chan error { return w.errs }

// Close stops the watch and returns once the Watcher's goroutine has
// ended; no value is sent on Changes or Errors after it returns. Calls
// after the first return the first's result.
func (w *Watcher) Close() error {
	w.close.Do(func() {
		close(w.done)
		<-w.stopped
		if err := w.fsw.Close(); err != nil {
			w.closeErr = fmt.Errorf("filewatch: closing the watch of %s: %w", w.path, err)
		}
	})
	return w.closeErr
}

func (w *Watcher) run() {
	defer close(w.stopped)
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	defer quiet.Stop()
	for {
		select {
		case <-w.done:
			return
		case _, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			// Any name: the file's own events, a rename over it, a
			// `..data` swap and a retarget all count; the read decides.
			quiet.Reset(w.debounce)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.sendErr(fmt.Errorf("filewatch: watching %s: %w", w.path, err))
			// Events may have been lost (an overflow): read anyway.
			quiet.Reset(w.debounce)
		case <-quiet.C:
			w.rewatch()
			fp, err := w.read()
			if err != nil {
				if err.Error() != w.readErr {
					w.readErr = err.Error()
					w.sendErr(err)
				}
				continue
			}
			w.readErr = ""
			if fp.differs(w.last) {
				w.last = fp
				select {
				case w.changes <- struct{}{}:
				default: // one is pending: it covers this change too
				}
			}
		}
	}
}

// read fingerprints the file, following symlinks. It reads the file as
// the router's loaders do (router/inputfile): a file that is not a
// regular file (a named pipe would block the read forever) or is over
// inputfile.MaxConfigSize is an error, not a change.
func (w *Watcher) read() (fingerprint, error) {
	if w.limit > 0 {
		return w.readLarge()
	}
	b, err := inputfile.ReadFile(w.path, inputfile.MaxConfigSize)
	switch {
	case err == nil:
		return fingerprint{state: present, sum: sha256.Sum256(b)}, nil
	case errors.Is(err, fs.ErrNotExist):
		// Also a dangling symlink (a target removed or not there yet).
		return fingerprint{state: absent}, nil
	default:
		return fingerprint{}, fmt.Errorf("filewatch: %w", err) // names the path
	}
}

// statKey is what readLarge compares before hashing a file again.
type statKey struct {
	dev, ino uint64
	size     int64
	mtime    int64 // UnixNano
}

// readLarge fingerprints the file for NewLarge: streamed through SHA-256
// up to w.limit bytes, or the last fingerprint when the file's statKey is
// the same as when it was hashed.
func (w *Watcher) readLarge() (fingerprint, error) {
	f, err := inputfile.Open(w.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		w.lastStat = statKey{}
		return fingerprint{state: absent}, nil
	case err != nil:
		return fingerprint{}, fmt.Errorf("filewatch: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return fingerprint{}, fmt.Errorf("filewatch: %w", err)
	}
	key := statKey{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key.dev, key.ino = uint64(st.Dev), uint64(st.Ino)
	}
	if w.last.state == present && key == w.lastStat {
		return w.last, nil
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, w.limit+1))
	if err != nil {
		return fingerprint{}, fmt.Errorf("filewatch: reading %s: %w", w.path, err)
	}
	if n > w.limit {
		return fingerprint{}, fmt.Errorf("filewatch: %s: %w: over the %d MiB limit", w.path, inputfile.ErrTooLarge, w.limit>>20)
	}
	fp := fingerprint{state: present}
	h.Sum(fp.sum[:0])
	w.lastStat = key
	return fp, nil
}

// rewatch makes the watched directories those the path leads through now:
// its own directory, that of each symlink on the way and that of its
// resolved target.
func (w *Watcher) rewatch() {
	want := map[string]bool{w.home: true}
	for _, d := range w.dirs() {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			want[real] = true
		}
	}
	// fsnotify's list, not one of our own: it drops a directory that was
	// deleted or moved, which may come back under the same name.
	have := map[string]bool{}
	for _, d := range w.fsw.WatchList() {
		have[d] = true
		if !want[d] {
			_ = w.fsw.Remove(d) // fails only when the watch is gone already
		}
	}
	for d := range want {
		if !have[d] {
			if err := w.fsw.Add(d); err != nil {
				w.sendErr(fmt.Errorf("filewatch: watching %s: directory %s: %w", w.path, d, err))
			}
		}
	}
}

// dirs lists the directories of the symlinks the path leads through and
// of its resolved target, unresolved.
func (w *Watcher) dirs() []string {
	var out []string
	p := w.path
	for range maxHops {
		target, err := os.Readlink(p)
		if err != nil {
			break // not a symlink, or gone
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = filepath.Clean(target)
		out = append(out, filepath.Dir(p))
	}
	if real, err := filepath.EvalSymlinks(w.path); err == nil {
		out = append(out, filepath.Dir(real))
	}
	return out
}

func (w *Watcher) sendErr(err error) {
	select {
	case w.errs <- err:
	default:
	}
}
