package workers

import (
	"context"
	"fmt"
	"strings"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/filewatch"
)

// Watch makes the workers file at path the Manager's configuration: it
// loads the file now and again whenever its content changes
// (config.LoadWorkers), and Syncs the workers it lists. The change
// detection is router/filewatch's: the file's directory and its resolved
// target's are watched and the content compared, so a write in place, an
// editor's or a deployment's atomic replace (write a temporary file,
// rename it over path), an edit of a symlinked file's target and a
// Kubernetes ConfigMap or Secret update (kubelet's `..data` symlink swap)
// are all seen, while a touch or a save without changes reloads nothing.
// Changes are debounced (Options.Debounce, 100 ms by default) so one save
// loads once. A file that fails to load changes nothing: its diagnostics
// are logged at file:line:col and the workers stay as they were. A missing
// file is such a failure too, until it appears.
//
// The file is the whole membership: workers the Manager got from an
// earlier Sync and the file does not list leave. Watch returns nil when
// ctx ends, or an error when the directory cannot be watched.
func (m *Manager) Watch(ctx context.Context, path string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()
	// Watching starts before the first load, so a change between the two
	// is reloaded rather than lost; it stops before Close's wait ends.
	w, err := filewatch.New(path, m.o.Debounce)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	defer func() { _ = w.Close() }()

	m.reload(path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.ctx.Done():
			return nil
		case <-w.Changes():
			m.reload(path)
		case err := <-w.Errors():
			m.log.Error("watching workers file", "path", path, "error", err)
		}
	}
}

// reload loads the workers file and Syncs it; a failure changes nothing.
func (m *Manager) reload(path string) {
	ws, diags := config.LoadWorkers(path)
	if diags.HasErrors() {
		m.log.Error("workers file not loaded; workers unchanged", "path", path,
			"diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
		return
	}
	if len(diags) > 0 {
		m.log.Warn("workers file", "path", path, "diagnostics", strings.TrimSpace(config.FormatDiagnostics(diags)))
	}
	if err := m.Sync(ws); err != nil {
		m.log.Error("workers file not applied; workers unchanged", "path", path, "error", err)
		return
	}
	m.log.Info("workers file loaded", "path", path, "workers", len(ws))
}
