// Package arch holds the repository's architecture as data and the tests
// that keep the code and the docs true to it: the floors each package
// stands on and what a floor may import (docs/architecture.md), and that
// every file path and Go identifier the docs name exists.
package arch
