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
// common API version, text on stdout, a sha256 mismatch, a missing binary,
// types that changed): a supervised restart that fails so marks the plugin
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
