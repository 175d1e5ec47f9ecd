//go:build !linux

package benchproc

// PortOwner names who listens on TCP port; outside Linux it cannot tell
// and says "another process".
func PortOwner(port int) string { return "another process" }
