//go:build !linux

package portowner

// Of names who listens on TCP port; outside Linux it cannot tell and
// says "another process".
func Of(port int) string { return "another process" }
