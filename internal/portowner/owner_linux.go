package portowner

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Of names who listens on TCP port (any local address, IPv4 or
// IPv6): "NAME (pid N)" from /proc/net/tcp{,6} (the listening socket's
// inode) and /proc/PID/fd (the process holding it), "a process of user
// UID" when the socket is another user's and its process cannot be seen,
// "no process now" when nothing listens on it any more. It reads each
// /proc file once: work linear in the sockets and open descriptors.
func Of(port int) string {
	inodes := map[string]string{} // socket inode -> owner's uid
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listeners(f, port, inodes)
	}
	if len(inodes) == 0 {
		return "no process now"
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, err := os.ReadDir(filepath.Join(p, "fd"))
		if err != nil {
			continue // another user's process, or gone
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(p, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if _, ok := inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")]; ok {
				comm, _ := os.ReadFile(filepath.Join(p, "comm"))
				return fmt.Sprintf("%s (pid %s)", strings.TrimSpace(string(comm)), filepath.Base(p))
			}
		}
	}
	for _, uid := range inodes {
		return "a process of user " + uid
	}
	return "another process"
}

// listeners adds to inodes (inode -> uid) the sockets of the table file
// (the /proc/net/tcp format: "sl local rem st tx:rx tr:when retrnsmt uid
// timeout inode ...", addresses as HEXADDR:HEXPORT, state 0A listening)
// that listen on port.
func listeners(file string, port int, inodes map[string]string) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(fs[1], ':')
		if i < 0 {
			continue
		}
		if p, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err != nil || int(p) != port {
			continue
		}
		inodes[fs[9]] = fs[7]
	}
}
