package live

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/switchyard-router/switchyard/router/filewatch"
	"github.com/switchyard-router/switchyard/router/loader"
)

// ReloaderOptions configure a Reloader.
type ReloaderOptions struct {
	// Path is the policy file.
	Path string
	// Watch reloads when the file's content changes (router/filewatch):
	// the file's directory and its resolved target's are watched and, once
	// events settle, the file is read and its content compared with the
	// last read. So an in-place write, an editor's rename over the file, an
	// edit of a symlinked file's target elsewhere and a Kubernetes
	// ConfigMap or Secret update (kubelet swaps the `..data` symlink; no
	// event names the file) each reload once, while a touch, a chmod, a
	// save without changes or other files in the directory reload
	// nothing. A file that disappears reloads (which fails, and the
	// running policies stay), and so does its return. To reload an
	// unchanged file send SIGHUP or call Trigger.
	//
	// Watch also watches the files the running policy's plugins run
	// (loader.Reloader.PluginFiles: each plugin's executable, the files
	// its args name and those its sha256_files pin; at most
	// MaxWatchedPluginFiles), each as the policy file is (content, not
	// metadata; filewatch.NewLarge, up to config.MaxPluginFileSize) and
	// with the same debounce: a change of one reloads the policy file, as
	// SIGHUP does, which starts every plugin afresh. A broken new plugin
	// fails that reload like a broken policy file (the running bundle
	// stays; loader.Reloader.Reload); fixing it reloads again. The set is
	// taken again after each reload.
	Watch bool
	// Debounce is the quiet period after a change: the file is reloaded
	// once no further change arrived for this long, so an editor's burst
	// makes one reload, of the finished file. Zero or less takes
	// filewatch.DefaultDebounce (100 ms).
	Debounce time.Duration
	// Signals, when set, is the channel whose values trigger a reload, in
	// place of the SIGHUP subscription Run makes (os/signal) when nil: the
	// caller can subscribe it itself (the Daemon does, for its whole
	// life), or send on it in tests.
	Signals <-chan os.Signal
	// OnReload, when set, is called after each reload with its
	// diagnostics (errors when the reload failed), from Run's goroutine.
	OnReload func(hcl.Diagnostics)
	// Logger receives why a reload starts and watch errors; nil discards
	// them. The outcome is logged by loader.Reloader.Reload.
	Logger hclog.Logger
}

// Reloader reloads a Router's policy file (loader.Reloader.Reload) on
// SIGHUP and, with Watch, when the file changes: the Daemon's reload
// loop. Reloads happen one at a time, on Run's goroutine.
type Reloader struct {
	r       *loader.Reloader
	o       ReloaderOptions
	path    string // absolute
	trigger chan struct{}
	ready   chan struct{}
	runOnce sync.Once
}

// NewReloader returns a Reloader of r's policy file o.Path; Run starts it.
// It fails when o.Path is empty or cannot be made absolute.
func NewReloader(r *loader.Reloader, o ReloaderOptions) (*Reloader, error) {
	if o.Path == "" {
		return nil, errors.New("live: reloader: no policy file")
	}
	abs, err := filepath.Abs(o.Path)
	if err != nil {
		return nil, fmt.Errorf("live: reloader: %w", err)
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return &Reloader{
		r:       r,
		o:       o,
		path:    filepath.Clean(abs),
		trigger: make(chan struct{}, 1),
		ready:   make(chan struct{}),
	}, nil
}

// Trigger asks for a reload, as SIGHUP does; triggers that arrive while
// one is pending make one reload.
func (l *Reloader) Trigger() {
	select {
	case l.trigger <- struct{}{}:
	default:
	}
}

// Ready is closed once Run listens: SIGHUP is caught and, with Watch, the
// file is watched (changes from then on reload).
func (l *Reloader) Ready() <-chan struct{} { return l.ready }

// Run reloads on SIGHUP, Trigger and (with Watch) file changes until ctx
// is done; it returns nil then, or an error when the watch cannot be set
// up. A Reloader runs once. Reloads use the Router's Reload (and so its
// drain bound); one in progress when ctx ends is cancelled (plugin starts
// stop, the running bundle stays).
func (l *Reloader) Run(ctx context.Context) error {
	first := false
	l.runOnce.Do(func() { first = true })
	if !first {
		return errors.New("live: reloader: Run called twice")
	}
	sigs := l.o.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}
	var (
		changes       <-chan struct{} // nil without Watch: never ready
		errs          <-chan error
		pluginChanges <-chan string
		plugins       *pluginWatch
	)
	if l.o.Watch {
		w, err := filewatch.New(l.path, l.o.Debounce)
		if err != nil {
			return fmt.Errorf("live: reloader: %w", err)
		}
		defer func() { _ = w.Close() }()
		changes, errs = w.Changes(), w.Errors()
		plugins = newPluginWatch(l.o.Debounce, l.o.Logger)
		defer plugins.close()
		plugins.set(l.r.PluginFiles())
		pluginChanges = plugins.changed
	}
	close(l.ready)

	reload := func(cause string) {
		// This reload reads the files as they are now: a change reported
		// before it is in it.
		select {
		case <-changes:
		default:
		}
		if plugins != nil {
			plugins.drain()
		}
		l.o.Logger.Info("reloading the policy file", "path", l.path, "cause", cause)
		diags := l.r.Reload(ctx, l.path)
		if plugins != nil {
			// The running bundle's plugin files: the new file's after a
			// reload that applied, the old one's after one that failed.
			plugins.set(l.r.PluginFiles())
		}
		if l.o.OnReload != nil {
			l.o.OnReload(diags)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-sigs:
			reload("signal " + s.String())
		case <-l.trigger:
			reload("trigger")
		case <-changes:
			reload("file changed")
		case path := <-pluginChanges:
			reload("plugin file changed: " + path)
		case err := <-errs:
			l.o.Logger.Warn("watching the policy file", "path", l.path, "error", err)
		}
	}
}
