//go:build !unix

package cputime

import "time"

// Process is unavailable here: it returns 0, and callers leave out the
// metric they would report from it.
func Process() time.Duration { return 0 }
