//go:build !unix

package prefix

import "time"

// cpuTime is unavailable here: the per-CPU-second metric is not reported.
func cpuTime() time.Duration { return 0 }
