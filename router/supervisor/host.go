package supervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// DefaultShutdownGrace is how long Shutdown lets in-flight calls finish.
const DefaultShutdownGrace = 2 * time.Second

// Options configure a Host.
type Options struct {
	// Logger receives the host's logs and, under a sub-logger named after
	// each plugin, the plugins' stderr. Default: hclog's default logger.
	Logger hclog.Logger
	// ShutdownGrace bounds how long Shutdown waits for in-flight calls
	// before it kills the plugins (DefaultShutdownGrace).
	ShutdownGrace time.Duration
}

// Stats are one plugin's decision-call counters.
type Stats struct {
	// Calls is every decision call (a fused Run, or a component called
	// alone), including those refused because the plugin was gone.
	Calls int64
	// Errors is the failed calls that did not time out.
	Errors int64
	// Timeouts is the calls that got no answer within call_timeout.
	Timeouts int64
	// Fallbacks is every failed call (Errors + Timeouts): each makes its
	// policy fall back.
	Fallbacks int64
}

// Host starts and supervises out-of-process plugins. It implements
// config.PluginHost. Safe for concurrent use.
type Host struct {
	log   hclog.Logger
	grace time.Duration

	// starting counts launches in progress (Start, Describe); Shutdown
	// waits for them. Add only under mu while !closed.
	starting sync.WaitGroup

	mu     sync.Mutex
	closed bool
	done   chan struct{} // closed when Shutdown has finished
	procs  map[string]*proc
	stats  map[string]*counters
}

var _ config.PluginHost = (*Host)(nil)

// NewHost returns a Host with no plugin running.
func NewHost(o Options) *Host {
	if o.Logger == nil {
		o.Logger = hclog.Default()
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	return &Host{
		log:   o.Logger,
		grace: o.ShutdownGrace,
		done:  make(chan struct{}),
		procs: make(map[string]*proc),
		stats: make(map[string]*counters),
	}
}

// Start launches the plugin p describes, completes the handshake,
// Describes it and returns its component types; each type's New
// configures an instance in the plugin. A failure is a *StartError; the
// process group is then gone and nothing is retried.
func (h *Host) Start(ctx context.Context, p config.Plugin) ([]shared.TypeInfo, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, &StartError{Plugin: p.Name, Cause: ErrHostClosed, Permanent: true}
	}
	if _, dup := h.procs[p.Name]; dup {
		h.mu.Unlock()
		return nil, &StartError{Plugin: p.Name, Cause: errors.New("already started"), Permanent: true}
	}
	h.procs[p.Name] = nil // reserved while starting
	st := h.stats[p.Name]
	if st == nil {
		st = &counters{}
		h.stats[p.Name] = st
	}
	h.starting.Add(1)
	h.mu.Unlock()
	defer h.starting.Done()

	pr, desc, err := h.launch(ctx, p, st)
	h.mu.Lock()
	if err != nil {
		delete(h.procs, p.Name)
	} else {
		h.procs[p.Name] = pr
	}
	h.mu.Unlock()
	if err != nil {
		h.log.Debug("plugin failed to start", "plugin", p.Name, "error", err)
		return nil, err
	}

	types := make([]shared.TypeInfo, len(desc.Types))
	for i, t := range desc.Types {
		types[i] = shared.TypeInfo{
			Name:   t.Name,
			Kind:   t.Kind,
			Inputs: t.Inputs,
			Params: slices.Clone(t.Params),
			Doc:    t.Doc,
			New: func(info shared.InstanceInfo, params shared.Params) (shared.Component, error) {
				return pr.configure(t.Name, t.Kind, info, params)
			},
		}
	}
	return types, nil
}

// Describe starts the binary command with args (no environment, no
// checksum), describes it and stops it: `router plugins describe`. The
// types' New is nil. An error stopping the binary is returned with the
// description.
func (h *Host) Describe(ctx context.Context, command string, args []string, startTimeout time.Duration) (*shared.Description, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, &StartError{Plugin: filepath.Base(command), Cause: ErrHostClosed, Permanent: true}
	}
	h.starting.Add(1)
	h.mu.Unlock()
	defer h.starting.Done()

	b := config.Plugin{Name: filepath.Base(command), Command: command, Args: args, StartTimeout: startTimeout}
	pr, desc, err := h.launch(ctx, b, &counters{})
	if err != nil {
		return nil, err
	}
	for i := range desc.Types {
		desc.Types[i].New = nil
	}
	if err := pr.stop(); err != nil {
		return desc, fmt.Errorf("plugin %q: stopping: %w", b.Name, err)
	}
	return desc, nil
}

// Stats returns the named plugin's counters; zero for an unknown name.
func (h *Host) Stats(name string) Stats {
	h.mu.Lock()
	c := h.stats[name]
	h.mu.Unlock()
	if c == nil {
		return Stats{}
	}
	return Stats{
		Calls:     c.calls.Load(),
		Errors:    c.errors.Load(),
		Timeouts:  c.timeouts.Load(),
		Fallbacks: c.fallbacks.Load(),
	}
}

// Shutdown stops every plugin: new calls fail at once, calls in flight get
// up to ShutdownGrace (or until ctx ends) to finish, then each client is
// closed, each plugin's whole process group killed and reaped, and its
// socket directory removed. Starts in progress finish first (bounded by
// their start_timeout) and are stopped too. A second Shutdown waits for
// the first. It returns the errors of plugins that did not stop cleanly.
func (h *Host) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		select {
		case <-h.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	defer close(h.done)

	h.starting.Wait()
	h.mu.Lock()
	var procs []*proc
	for _, p := range h.procs {
		if p != nil {
			procs = append(procs, p)
		}
	}
	h.procs = map[string]*proc{}
	h.mu.Unlock()
	slices.SortFunc(procs, func(a, b *proc) int { return strings.Compare(a.name, b.name) })

	drained := make([]<-chan struct{}, len(procs))
	for i, p := range procs {
		drained[i] = p.beginClose()
	}
	grace := time.NewTimer(h.grace)
	defer grace.Stop()
wait:
	for i, d := range drained {
		select {
		case <-d:
		case <-grace.C:
			h.log.Warn("shutdown grace expired with calls in flight", "plugin", procs[i].name, "grace", h.grace)
			break wait
		case <-ctx.Done():
			break wait
		}
	}

	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() {
			if err := p.stop(); err != nil {
				errs[i] = fmt.Errorf("plugin %q: %w", p.name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
