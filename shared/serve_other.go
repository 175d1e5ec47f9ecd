//go:build !unix

package shared

// killOwnGroup does nothing without Unix process groups.
func killOwnGroup() {}
