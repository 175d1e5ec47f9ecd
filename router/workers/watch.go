package workers

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/switchyard-router/switchyard/router/config"
)

// Watch makes the workers file at path the Manager's configuration: it
// loads the file now and again whenever it changes (config.LoadWorkers),
// and Syncs the workers it lists. It watches the file's directory, so an
// editor's or a deployment's atomic replace (write a temporary file, rename
// it over path) is seen as well as a write in place; changes are debounced
// (Options.Debounce, 100 ms by default) so one save loads once. A file that
// fails to load changes nothing: its diagnostics are logged at
// file:line:col and the workers stay as they were. A missing file is such a
// failure too, until it appears.
//
// The file is the whole membership: workers the Manager got from an
// earlier Sync and the file does not list leave. Watch returns nil when
// ctx ends, or an error when the directory cannot be watched.
func (m *Manager) Watch(ctx context.Context, path string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("workers: watching %s: %w", path, err)
	}
	defer w.Close()
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("workers: watching %s: %w", path, err)
	}
	if err := w.Add(filepath.Dir(abs)); err != nil {
		return fmt.Errorf("workers: watching %s: %w", path, err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()

	m.reload(path)
	var (
		timer *time.Timer
		fire  <-chan time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if filepath.Clean(ev.Name) != abs || ev.Op == fsnotify.Chmod {
				continue
			}
			if timer == nil {
				timer = time.NewTimer(m.o.Debounce)
			} else {
				timer.Reset(m.o.Debounce)
			}
			fire = timer.C
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			m.log.Error("watching workers file", "path", path, "error", err)
		case <-fire:
			fire = nil
			m.reload(path)
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
