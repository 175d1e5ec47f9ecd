// Package portowner names the process that holds a TCP port, for the
// error of a process started on a fixed port that found it taken: the
// benchmark programs' children (bench/internal/benchproc) and the
// router's end-to-end tests (cmd/router). It imports nothing of the
// module.
package portowner

import (
	"fmt"
	"regexp"
	"strconv"
)

// addrInUse matches Go's error for a bind to a taken port ("listen tcp
// 127.0.0.1:8080: bind: address already in use"); group 1 is the port.
var addrInUse = regexp.MustCompile(`:(\d+): bind: address already in use`)

// TakenNote is "\nport N is held by OWNER" (Of) when log holds Go's
// error for a bind to the taken port N (the first such error), else "".
// Its work is linear in log's length.
func TakenNote(log []byte) string {
	m := addrInUse.FindSubmatch(log)
	if m == nil {
		return ""
	}
	port, err := strconv.Atoi(string(m[1]))
	if err != nil {
		return ""
	}
	return fmt.Sprintf("\nport %d is held by %s", port, Of(port))
}
