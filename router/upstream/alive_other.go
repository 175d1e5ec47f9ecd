//go:build !unix

package upstream

import "net"

// alive cannot peek without blocking on this platform: a closed idle
// connection is caught by RoundTrip's one retry instead.
func alive(net.Conn) bool { return true }
