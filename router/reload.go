package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/filewatch"
)

// Values of the result label of switchyard_policy_reloads_total.
const (
	ReloadSuccess = "success"
	ReloadFailure = "failure"
)

// registerReloads registers switchyard_policy_reloads_total with reg, or
// returns the counter an earlier Router registered there.
func registerReloads(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_policy_reloads_total",
		Help: "Policy file reloads by result: success (the new policies decide) or failure (the running ones stay).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	// Both series exist from the start, so rate() and alerts see a 0.
	c.WithLabelValues(ReloadSuccess)
	c.WithLabelValues(ReloadFailure)
	return c, nil
}

func (r *Router) countReload(result string) {
	if r.reloads != nil {
		r.reloads.WithLabelValues(result).Inc()
	}
}

// Reload loads the policy file at path into a new bundle beside the
// running one (LoadBundle: plugins started and configured, policies
// compiled), applies it once it is ready, then drains the old bundle
// (bounded by Options.DrainTimeout) and stops its plugins. Decisions never
// wait for a reload: until the new bundle is applied they decide with the
// old one, and those in flight at the switch finish on it.
//
// Every plugin of the new file is started fresh, in its own Host, also
// when its block did not change: a reload is also how a rebuilt plugin
// binary is picked up.
//
// When the file does not load (or sets another router.block_size, which
// needs a restart) the running bundle stays, the diagnostics are returned
// and logged, and switchyard_policy_reloads_total{result="failure"} counts
// it; a reload that applied counts result="success" and returns the
// file's warnings. Reloads are serialised.
func (r *Router) Reload(ctx context.Context, path string) hcl.Diagnostics {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	start := time.Now()
	b, diags := LoadBundle(ctx, path, r.loadOpts)
	if !diags.HasErrors() && b != nil {
		var err error
		var old *Bundle
		if old, err = r.Apply(b); err == nil {
			r.countReload(ReloadSuccess)
			if len(diags) > 0 {
				r.log.Warn("policy file reloaded with warnings", "path", path, "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
			}
			r.log.Info("policy file reloaded", "path", path, "load", time.Since(start))
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.drainTimeout)
			defer cancel()
			if err := old.Close(dctx); err != nil {
				r.log.Warn("previous policy bundle did not stop cleanly", "error", err)
			}
			return diags
		}
		summary := "Policy cannot be applied"
		if errors.Is(err, ErrBlockSize) {
			summary = "router.block_size cannot change on reload"
			err = fmt.Errorf("the file sets block_size %d, the running router uses %d (the prefix index and bookings are in its blocks); restart the router to change it", b.BlockSize(), r.blockSize)
		}
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  summary,
			Detail:   err.Error() + ".",
			Subject:  &hcl.Range{Filename: path, Start: hcl.InitialPos, End: hcl.InitialPos},
		})
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedLoadShutdown)
		defer cancel()
		if err := b.Close(cctx); err != nil {
			r.log.Warn("rejected policy bundle did not stop cleanly", "error", err)
		}
	}
	r.countReload(ReloadFailure)
	r.log.Error("policy file reload failed; the running policies stay", "path", path,
		"diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	return diags
}

// DefaultDebounce is the Reloader's quiet period: a change of the watched
// file is reloaded once no further change arrived for this long, so an
// editor's burst (truncate, write, write, chmod; or write a temporary file
// and rename it over) makes one reload, of the finished file.
const DefaultDebounce = 100 * time.Millisecond

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
	// unchanged file (say, for a rebuilt plugin binary) send SIGHUP or
	// call Trigger.
	Watch bool
	// Debounce is the quiet period after a change (DefaultDebounce).
	Debounce time.Duration
	// Signals, when set, is the channel whose values trigger a reload, in
	// place of the SIGHUP subscription Run makes (os/signal) when nil: the
	// caller can subscribe it itself, or send on it in tests.
	Signals <-chan os.Signal
	// OnReload, when set, is called after each reload with its
	// diagnostics (errors when the reload failed), from Run's goroutine.
	OnReload func(hcl.Diagnostics)
	// Logger receives why a reload starts and watch errors; nil discards
	// them. The outcome is logged by Router.Reload.
	Logger hclog.Logger
}

// Reloader reloads a Router's policy file on SIGHUP and, with Watch, when
// the file changes: the long-running modes' (router serve) reload loop.
// Reloads happen one at a time, on Run's goroutine.
type Reloader struct {
	r        *Router
	o        ReloaderOptions
	path     string // absolute
	trigger  chan struct{}
	ready    chan struct{}
	runOnce  sync.Once
	debounce time.Duration
}

// NewReloader returns a Reloader of r's policy file o.Path; Run starts it.
func NewReloader(r *Router, o ReloaderOptions) (*Reloader, error) {
	if o.Path == "" {
		return nil, errors.New("router: reloader: no policy file")
	}
	abs, err := filepath.Abs(o.Path)
	if err != nil {
		return nil, fmt.Errorf("router: reloader: %w", err)
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	return &Reloader{
		r:        r,
		o:        o,
		path:     filepath.Clean(abs),
		trigger:  make(chan struct{}, 1),
		ready:    make(chan struct{}),
		debounce: o.Debounce,
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
		return errors.New("router: reloader: Run called twice")
	}
	sigs := l.o.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGHUP)
		defer signal.Stop(ch)
		sigs = ch
	}
	var (
		changes <-chan struct{} // nil without Watch: never ready
		errs    <-chan error
	)
	if l.o.Watch {
		w, err := filewatch.New(l.path, l.debounce)
		if err != nil {
			return fmt.Errorf("router: reloader: %w", err)
		}
		defer func() { _ = w.Close() }()
		changes, errs = w.Changes(), w.Errors()
	}
	close(l.ready)

	reload := func(cause string) {
		// This reload reads the file as it is now: a change reported
		// before it is in it.
		select {
		case <-changes:
		default:
		}
		l.o.Logger.Info("reloading the policy file", "path", l.path, "cause", cause)
		diags := l.r.Reload(ctx, l.path)
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
		case err := <-errs:
			l.o.Logger.Warn("watching the policy file", "path", l.path, "error", err)
		}
	}
}
