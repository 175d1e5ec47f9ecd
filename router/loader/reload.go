package loader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
)

// ReloadOptions configure a Reloader.
type ReloadOptions struct {
	// Load adjusts the loads Reload makes. Its Logger defaults to Logger.
	Load LoadOptions
	// Logger receives reload outcomes (failures with their diagnostics,
	// warnings, drain problems); nil discards them.
	Logger hclog.Logger
	// Registerer, when set, gets
	// switchyard_policy_reloads_total{result="success"|"failure"};
	// Reloaders on one registry share the counter. nil means no metrics.
	Registerer prometheus.Registerer
	// DrainTimeout bounds how long Reload waits for the decisions in
	// flight on the old bundle before stopping its plugins
	// (DefaultDrainTimeout).
	DrainTimeout time.Duration
}

// DefaultDrainTimeout bounds the drain of a swapped-out bundle. Decisions
// in flight are bounded by their plugins' call_timeout (then the fallback
// decides), so a drain normally takes microseconds to milliseconds.
const DefaultDrainTimeout = 2 * time.Second

// Reloader reloads a Router's policy file: Reload loads it into a new
// Bundle and swaps it in (router.Router.Apply). What decides when to
// reload (SIGHUP, the file's watch) is serve.Reloader's. Safe for
// concurrent use; reloads are serialised.
type Reloader struct {
	r            *router.Router
	load         LoadOptions
	log          hclog.Logger
	drainTimeout time.Duration
	reloads      *prometheus.CounterVec // nil without a Registerer
	mu           sync.Mutex             // serialises Reload
}

// NewReloader returns a Reloader of r. The error is the metric's
// registration's.
func NewReloader(r *router.Router, o ReloadOptions) (*Reloader, error) {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Load.Logger == nil {
		o.Load.Logger = o.Logger
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	x := &Reloader{r: r, load: o.Load, log: o.Logger, drainTimeout: o.DrainTimeout}
	if o.Registerer != nil {
		var err error
		if x.reloads, err = registerReloads(o.Registerer); err != nil {
			return nil, fmt.Errorf("loader: metrics: %w", err)
		}
	}
	return x, nil
}

// Values of the result label of switchyard_policy_reloads_total.
const (
	ReloadSuccess = "success"
	ReloadFailure = "failure"
)

// registerReloads registers switchyard_policy_reloads_total with reg, or
// returns the counter an earlier Reloader registered there.
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

func (x *Reloader) countReload(result string) {
	if x.reloads != nil {
		x.reloads.WithLabelValues(result).Inc()
	}
}

// Reload loads the policy file at path into a new bundle beside the
// running one (LoadBundle: plugins started and configured, policies
// compiled), applies it once it is ready (router.Router.Apply), then
// drains the old bundle (bounded by ReloadOptions.DrainTimeout) and stops
// its plugins. Decisions never
// wait for a reload: until the new bundle is applied they decide with the
// old one, and those in flight at the switch finish on it.
//
// Every plugin of the new file is started fresh, in its own Host, also
// when its block did not change: a reload is also how a rebuilt plugin
// binary is picked up.
//
// When the file does not load (or sets another router.block_size, or sets
// it where the running file did not or the reverse, which needs a restart) the running bundle stays, the diagnostics are returned
// and logged, and switchyard_policy_reloads_total{result="failure"} counts
// it; a reload that applied counts result="success" and returns the
// file's warnings. Reloads are serialised.
func (x *Reloader) Reload(ctx context.Context, path string) hcl.Diagnostics {
	x.mu.Lock()
	defer x.mu.Unlock()
	start := time.Now()
	b, diags := LoadBundle(ctx, path, x.load)
	if !diags.HasErrors() && b != nil {
		var err error
		var old *router.Bundle
		if old, err = x.r.Apply(b.Bundle); err == nil {
			x.countReload(ReloadSuccess)
			if len(diags) > 0 {
				x.log.Warn("policy file reloaded with warnings", "path", path, "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
			}
			x.log.Info("policy file reloaded", "path", path, "load", time.Since(start))
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), x.drainTimeout)
			defer cancel()
			if err := old.Close(dctx); err != nil {
				x.log.Warn("previous policy bundle did not stop cleanly", "error", err)
			}
			return diags
		}
		summary := "Policy cannot be applied"
		if errors.Is(err, router.ErrBlockSize) {
			summary = "router.block_size cannot change on reload"
			err = fmt.Errorf("the file %s, the running router's %s (every model's keys and the workers' capacities are in its blocks); restart the router to change it",
				blockSizeSetting(b.BlockSizeOverride()), blockSizeSetting(x.r.BlockSizeOverride()))
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
			x.log.Warn("rejected policy bundle did not stop cleanly", "error", err)
		}
	}
	x.countReload(ReloadFailure)
	x.log.Error("policy file reload failed; the running policies stay", "path", path,
		"diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	return diags
}

// blockSizeSetting words a file's router.block_size override (0: unset)
// for the reload error.
func blockSizeSetting(override int) string {
	if override == 0 {
		return "leaves router.block_size unset (each model keyed at its engines' block size)"
	}
	return fmt.Sprintf("sets router.block_size %d", override)
}

// PluginFiles lists the files the plugins of the bundle the Router decides
// with now run (Bundle.PluginFiles); nil when it has none or was not
// loaded from a policy file. After a failed reload these are the running
// bundle's.
func (x *Reloader) PluginFiles() []string {
	if b := Current(x.r); b != nil {
		return b.PluginFiles()
	}
	return nil
}
