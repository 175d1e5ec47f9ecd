package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/config"
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
// When the file does not load (or sets another router.block_size, or sets
// it where the running file did not or the reverse, which needs a restart) the running bundle stays, the diagnostics are returned
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
			err = fmt.Errorf("the file %s, the running router's %s (every model's keys and the workers' capacities are in its blocks); restart the router to change it",
				blockSizeSetting(b.BlockSizeOverride()), blockSizeSetting(r.override))
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

// blockSizeSetting words a file's router.block_size override (0: unset)
// for the reload error.
func blockSizeSetting(override int) string {
	if override == 0 {
		return "leaves router.block_size unset (each model keyed at its engines' block size)"
	}
	return fmt.Sprintf("sets router.block_size %d", override)
}
