package supervisor

import (
	"errors"
	"fmt"
)

// ErrHostClosed is wrapped by Start after Shutdown has begun.
var ErrHostClosed = errors.New("plugin host is shut down")

// StartError is a plugin that could not be started: its binary did not run,
// did not complete the go-plugin handshake within start_timeout, or its
// Describe answer was unusable. Host.Start never retries. Permanent marks
// failures that starting again cannot fix (wrong handshake cookie, no
// common API version, text on stdout or a malformed handshake line, a
// handshake address that is not a unix socket or loopback TCP, a sha256
// mismatch, a missing binary or a directory, types that changed): a supervised restart that fails so marks the plugin
// failed (StatusFailed) until a reload. Other restart failures (no
// handshake within start_timeout, which a starved machine can cause, or a
// process that exits while being configured) are retried after the
// backoff.
type StartError struct {
	Plugin    string
	Cause     error
	Permanent bool
}

func (e *StartError) Error() string {
	return fmt.Sprintf("plugin %q: %v", e.Plugin, e.Cause)
}

// Unwrap returns the cause.
func (e *StartError) Unwrap() error { return e.Cause }

// IsPermanent reports whether err holds a permanent *StartError.
func IsPermanent(err error) bool {
	var se *StartError
	return errors.As(err, &se) && se.Permanent
}

// CallError is a decision or classify call of a plugin that got no usable
// answer, so its policy's fallback decides (a classify call fails only its
// request). Every error such a call returns is a *CallError; errors.Is
// still sees its cause (ErrCallTimeout, ErrBreakerOpen, ErrRestarting,
// pluginclient.ErrPluginClosed, pluginclient.ErrComponentPanicked,
// *pluginclient.InvalidAnswerError...) through Unwrap.
type CallError struct {
	// Plugin is the name of the plugin block.
	Plugin string
	// Cause says why, as the code label of
	// switchyard_plugin_call_errors_total: "error" (a component returned
	// an error), "panic" (a component panicked; the plugin's SDK recovered
	// it), "invalid_answer" (the plugin answered rows, costs or a pick
	// that do not fit the task: pluginclient.CheckResult; errors.As finds
	// the *pluginclient.InvalidAnswerError and its Reason), "timeout" (no
	// answer within call_timeout), "too_large" (a
	// message over shared.MaxMessageBytes), "closed" (the process or its
	// stream went away during the call), "restarting" and "failed"
	// (refused: the process is being restarted, or is not restarted any
	// more), "breaker_open" (refused by the circuit breaker), "shutdown"
	// (refused: the host is shutting down) or "canceled" (the caller's
	// own context ended; no fallback then).
	Cause string
	// Err is the error, worded `plugin "NAME": ...`.
	Err error
}

func (e *CallError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *CallError) Unwrap() error { return e.Err }
