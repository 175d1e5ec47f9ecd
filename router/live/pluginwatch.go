package live

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/filewatch"
)

// MaxWatchedPluginFiles bounds the plugin files `--watch` watches (each
// watch is an inotify instance on Linux, whose default per-user limit is
// 128): files past it are not watched, with a warning; SIGHUP still
// reloads them.
const MaxWatchedPluginFiles = 32

// pluginWatch watches the files the running policy's plugins run
// (loader.Bundle.PluginFiles) for a Reloader with Watch: a change of one
// (its content, per filewatch.NewLarge) is sent on changed. Set replaces
// the set of files after each reload. Used from the Reloader's Run
// goroutine only, but for the forwarders it starts.
type pluginWatch struct {
	debounce time.Duration
	log      hclog.Logger
	changed  chan string // the path of a changed file; capacity 1, coalescing
	watches  map[string]*watched
	warned   bool // the MaxWatchedPluginFiles warning was logged
}

type watched struct {
	w    *filewatch.Watcher
	stop chan struct{}
	done sync.WaitGroup
}

func newPluginWatch(debounce time.Duration, log hclog.Logger) *pluginWatch {
	return &pluginWatch{debounce: debounce, log: log, changed: make(chan string, 1), watches: map[string]*watched{}}
}

// set makes files the watched set: files no longer listed stop being
// watched, new ones start. A file's watch is kept across reloads, so a
// change made during a reload is not lost.
func (pw *pluginWatch) set(files []string) {
	if len(files) > MaxWatchedPluginFiles {
		if !pw.warned {
			pw.log.Warn("the policy's plugins run more files than --watch watches; changes of the others need SIGHUP",
				"files", len(files), "watched", MaxWatchedPluginFiles, "not_watched", files[MaxWatchedPluginFiles:])
			pw.warned = true
		}
		files = files[:MaxWatchedPluginFiles]
	}
	for _, path := range slices.Sorted(maps.Keys(pw.watches)) {
		if !slices.Contains(files, path) {
			pw.watches[path].close()
			delete(pw.watches, path)
		}
	}
	for _, path := range files {
		if pw.watches[path] != nil {
			continue
		}
		w, err := filewatch.NewLarge(path, pw.debounce, config.MaxPluginFileSize)
		if err != nil {
			pw.log.Warn("cannot watch a plugin's file; a change of it needs SIGHUP", "path", path, "error", err)
			continue
		}
		x := &watched{w: w, stop: make(chan struct{})}
		x.done.Go(func() { pw.forward(x, path) })
		pw.watches[path] = x
	}
}

// forward relays x's changes to changed, and logs its errors, until x is
// closed.
func (pw *pluginWatch) forward(x *watched, path string) {
	for {
		select {
		case <-x.stop:
			return
		case <-x.w.Changes():
			select {
			case pw.changed <- path:
			default: // one is pending: its reload covers this change too
			}
		case err := <-x.w.Errors():
			pw.log.Warn("watching a plugin's file", "path", path, "error", err)
		}
	}
}

func (x *watched) close() {
	close(x.stop)
	x.done.Wait()
	_ = x.w.Close()
}

// close stops every watch.
func (pw *pluginWatch) close() {
	for path, x := range pw.watches {
		x.close()
		delete(pw.watches, path)
	}
}

// drain drops a pending change: the reload about to start reads the files
// as they are now.
func (pw *pluginWatch) drain() {
	select {
	case <-pw.changed:
	default:
	}
}
