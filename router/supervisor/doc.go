// Package supervisor is the router's plugin host: it launches plugin
// binaries through go-plugin (gRPC only, one handshake cookie, API version
// negotiated from v1), describes them, configures their component
// instances, and turns those instances into components the pipeline
// calls, fusing consecutive members of a policy that live in one plugin
// into one Decide task.
//
// Each start is a fresh exec.Cmd in its own process group with a
// parent-death signal, the block's environment only, and a private socket
// directory. A plugin that fails its handshake (wrong cookie, no common
// API version, text on stdout, a sha256 mismatch, no handshake within
// start_timeout) is a permanent *StartError and is never retried.
// Shutdown drains in-flight calls for a bounded grace, then kills every
// plugin's whole process group and removes its socket directory.
package supervisor
