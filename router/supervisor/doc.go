// Package supervisor is the router's plugin host: it launches plugin
// binaries through go-plugin (gRPC only, one handshake cookie, API version
// negotiated from v1), describes them, configures their component
// instances, and turns those instances into components the pipeline
// calls, fusing consecutive members of a policy that live in one plugin
// into one Decide task.
//
// Each start is a fresh exec.Cmd in its own process group with SIGTERM as
// its parent-death signal (forked from a thread kept alive for the
// process's lifetime, see startPinned; the SDK's Serve answers it by
// killing its group and removing its socket directory), the block's
// environment only, and a private socket directory. A plugin that fails
// its handshake (wrong cookie, no common API version, text on stdout, a
// sha256 mismatch) is a permanent *StartError and is never retried; Start
// never retries any failure (no handshake within start_timeout included).
// Shutdown drains in-flight calls for a bounded grace, then kills every
// plugin's whole process group and removes its socket directory.
//
// Supervision: a plugin's exit is seen at once (a pidfd, so a descendant
// holding its pipes does not hide it; the exit pipe elsewhere); calls in
// flight fail with pluginclient.ErrPluginClosed and calls fail fast until a new
// process, started after an exponential backoff with jitter
// (RestartPolicy), has every instance configured again under the same
// name, role and parameters. Past max_restarts within window the plugin is
// crash-looping (StatusBackoff): its policies decide by fallback while it
// is retried after a backoff doubling up to CrashLoopBackoffMax, and it
// serves again by itself once a start succeeds. Only a restart that fails
// its handshake, or max_restarts = 0, makes it failed (StatusFailed) until
// a reload. A frozen plugin (ProbeFailures consecutive gRPC health checks
// without an answer within their own deadline) or a stuck one (decision
// calls unanswered for StallTimeout with nothing at all received on its
// Decide stream meanwhile) has its process group killed and is restarted
// (HealthPolicy); a call that misses call_timeout only makes the probe
// check at once. A circuit
// breaker per process (BreakerPolicy, gobreaker) refuses calls while open.
// An answer that does not fit its task (pluginclient.CheckResult: a cost
// short, a NaN cost, a row out of range) fails its call like an error,
// with the cause invalid_answer, and counts toward the breaker.
// Every failed call's error lets the router's fallback decide; none wraps
// context.DeadlineExceeded unless the caller's own deadline passed.
//
// What a plugin writes is bounded on its way to the router's log: stderr
// at StderrRate bytes a second per process (bursts of StderrBurst), each
// line cut at 4 KiB and control-escaped (stderrLog); stdout after the
// handshake is read for the process's whole life and discarded, so that
// no write of the plugin's ever blocks (cmdRunner).
// Metrics go to the registry in Options (NewMetrics).
package supervisor
