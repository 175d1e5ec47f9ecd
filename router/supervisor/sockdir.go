package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Socket directories (docs/plugin-protocol.md §1): each plugin process
// gets a private directory named sy-PID-RANDOM, PID being the router's
// process id, in the temporary directory. The router holds an exclusive
// flock(2) on the directory for as long as it uses it (socketDir); the
// kernel drops the lock when the router's process ends, however it ends
// (SIGKILL included). So a directory whose lock can be taken has no live
// owner: that is what SweepSocketDirs removes. A lock lives on the file
// system, so this holds for several routers on one machine, in other pid
// namespaces (containers sharing /tmp) too. The PID in the name is a
// second guard (a directory whose named owner is alive in this pid
// namespace is kept, unless it is this process's own pid: a restarted
// container's router often has the pid of its predecessor) and tells an
// operator whose directory it is.

// maxSocketDir keeps the socket path (dir + "/plugin" + 10 digits) within
// the 108 bytes of a unix socket address.
const maxSocketDir = 80

// socketDirPrefix starts the name of every socket directory.
const socketDirPrefix = "sy-"

// socketDirAttempts bounds socketDir's retries when a sweeping router
// holds the lock of the directory just made.
const socketDirAttempts = 3

// socketDir creates the plugin's private socket directory (mode 0700),
// sy-PID-RANDOM in the temporary directory, or in /tmp when that path
// would be too long for a socket, and locks it (lockDir). The caller
// closes the lock once it has removed the directory. Where the file
// system refuses flock the directory is returned unlocked (nil lock): a
// sweep then never removes it (it cannot take the lock either).
func socketDir() (string, io.Closer, error) {
	var last error
	for range socketDirAttempts {
		dir, err := mkSocketDir()
		if err != nil {
			return "", nil, err
		}
		lock, err := lockDir(dir)
		if errors.Is(err, errLocked) {
			// A sweeping router took it between our mkdir and our lock
			// (it will find our pid alive and keep it, or remove it):
			// make another.
			_ = os.Remove(dir)
			last = err
			continue
		}
		if err != nil {
			return dir, nil, nil
		}
		return dir, lock, nil
	}
	return "", nil, fmt.Errorf("locking a socket directory: %w", last)
}

func mkSocketDir() (string, error) {
	pattern := socketDirPrefix + strconv.Itoa(os.Getpid()) + "-"
	dir, err := os.MkdirTemp("", pattern)
	if err != nil || len(dir) <= maxSocketDir {
		return dir, err
	}
	_ = os.Remove(dir)
	return os.MkdirTemp("/tmp", pattern)
}

// errLocked is lockDir's error when another holds the lock.
var errLocked = errors.New("locked by another process")

// socketDirOwner parses the owner pid out of a socket directory's base
// name (sy-PID-RANDOM); ok is false for another name, such as the
// sy-RANDOM of routers before PID was in the name, whose owner cannot be
// told and which are never swept.
func socketDirOwner(base string) (pid int, ok bool) {
	rest, found := strings.CutPrefix(base, socketDirPrefix)
	if !found {
		return 0, false
	}
	digits, random, found := strings.Cut(rest, "-")
	if !found || random == "" || digits == "" || len(digits) > 10 {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != digits {
		return 0, false
	}
	return pid, true
}

// maxSweep bounds one sweep: the directory entries it reads and the
// directories it removes.
const (
	maxSweepEntries = 100_000
	maxSweepRemoved = 1_000
)

// SweepSocketDirs removes, from each of dirs (the temporary directories;
// see SocketTempDirs), the socket directories left by routers that are
// gone: each directory named sy-PID-RANDOM that this user owns, whose
// lock it can take (no live process holds it) and whose PID is not a
// live process of this pid namespace other than this process. Anything
// else, a live router's directory, another user's, a sy-RANDOM of an
// older router, a file, is kept. It returns the directories removed and
// the errors met (a directory that could not be read or removed); it
// reads at most 100,000 entries and removes at most 1,000 directories
// per temporary directory.
func SweepSocketDirs(dirs ...string) ([]string, error) {
	var removed []string
	var errs []error
	for _, d := range dirs {
		r, err := sweepDir(d)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

func sweepDir(tmp string) ([]string, error) {
	f, err := os.Open(tmp)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("sweeping socket directories: %w", err)
	}
	defer func() { _ = f.Close() }()
	var removed []string
	var errs []error
	read := 0
	for read < maxSweepEntries && len(removed) < maxSweepRemoved {
		names, err := f.Readdirnames(256)
		read += len(names)
		for _, name := range names {
			if len(removed) >= maxSweepRemoved {
				break
			}
			pid, ok := socketDirOwner(name)
			if !ok {
				continue
			}
			path := filepath.Join(tmp, name)
			gone, err := sweepOne(path, pid)
			if err != nil {
				errs = append(errs, err)
			}
			if gone {
				removed = append(removed, path)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				errs = append(errs, fmt.Errorf("sweeping socket directories: %w", err))
			}
			break
		}
	}
	return removed, errors.Join(errs...)
}

// sweepOne removes the socket directory path, owned by pid by its name,
// when its owner is gone (see SweepSocketDirs); it holds the directory's
// lock while it removes it.
func sweepOne(path string, pid int) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() || !ownedByMe(fi) {
		return false, nil
	}
	if pid != os.Getpid() && processAlive(pid) {
		return false, nil
	}
	lock, err := lockDir(path)
	if err != nil {
		return false, nil // a live owner holds it, or no lock can be taken here
	}
	defer func() { _ = lock.Close() }()
	if err := os.RemoveAll(path); err != nil {
		return false, fmt.Errorf("removing the stale socket directory: %w", err)
	}
	return true, nil
}

// processAlive reports whether pid is a process of this pid namespace
// (signal 0: EPERM means it exists, under another user).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// SocketTempDirs are the directories socketDir makes socket directories
// in: the temporary directory (os.TempDir) and, when a socket path there
// would be too long, /tmp.
func SocketTempDirs() []string {
	tmp := os.TempDir()
	// The longest name: sy-, a 10-digit pid, -, MkdirTemp's 10 digits.
	if len(filepath.Join(tmp, socketDirPrefix+"1234567890-1234567890")) > maxSocketDir && filepath.Clean(tmp) != "/tmp" {
		return []string{tmp, "/tmp"}
	}
	return []string{tmp}
}

// sweepOnce sweeps the stale socket directories once per process, before
// its first plugin's socket directory is made (Host.launch).
var sweepOnce sync.Once

// sweepSocketDirs sweeps SocketTempDirs and logs what it removed.
func (h *Host) sweepSocketDirs() {
	removed, err := SweepSocketDirs(SocketTempDirs()...)
	for _, d := range removed {
		h.log.Info("removed a stale plugin socket directory: its router is gone", "dir", d)
	}
	if err != nil {
		h.log.Warn("sweeping stale plugin socket directories", "error", err)
	}
}
