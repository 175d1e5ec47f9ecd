package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
)

// pendingFile is an output file written atomically: the content goes to a
// temporary file in the target's directory, which commit renames over the
// target and abort removes. Until commit the target is untouched, and a
// reader never sees a partly written file.
type pendingFile struct {
	flag   string // the flag that named the file, for messages
	target string // the path renamed over: the named path, symlinks resolved
	f      *os.File
	stdout io.Writer // when set, commit copies f here (createOutput of "-")
	done   bool
}

// createPending creates the temporary file for an output at path, named by
// flag. Creating it up front checks that the directory exists and is
// writable before any work is done. The temporary is created with mode
// 0644 (less the umask), as os.Create would create the target; a target
// that exists keeps its permission bits. A path that names a symbolic link
// writes the link's target, as os.Create would. A target that exists but is
// not a regular file (a directory, a device such as /dev/stdout, a named
// pipe) is refused: it cannot be replaced by a rename. So is the file the
// router's standard input, output or error is redirected to (stdStream).
func createPending(flag, path string) (*pendingFile, error) {
	var perm fs.FileMode = 0o644
	// Stat follows links as the kernel does, /proc's too (/dev/stdout to a
	// pipe reads "pipe:[N]" as a link but is the pipe).
	if fi, err := os.Stat(path); err == nil {
		switch {
		case fi.IsDir():
			return nil, fmt.Errorf("%s %s: is a directory, want a file", flag, path)
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("%s %s: not a regular file (outputs are written to a temporary file and renamed over the target)", flag, path)
		}
		if name := stdStream(fi); name != "" {
			return nil, fmt.Errorf("%s %s: is the router's standard %s (a file it was redirected to), which the output would replace, not write to; use %s - for standard output, or name another file", flag, path, name, flag)
		}
		perm = fi.Mode().Perm()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	target, err := linkTarget(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	dir, base := filepath.Dir(target), filepath.Base(target)
	for range 100 {
		name := filepath.Join(dir, "."+base+"."+strconv.FormatUint(uint64(rand.Uint32()), 36)+".tmp")
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the temporary's name means nothing to the user
			}
			return nil, fmt.Errorf("%s %s: cannot create a file in %s: %w", flag, path, dir, err)
		}
		if perm != 0o644 {
			// An existing target keeps its mode; Chmod ignores the umask,
			// as the mode is the one the file already had.
			if err := f.Chmod(perm); err != nil {
				f.Close()
				os.Remove(name)
				return nil, fmt.Errorf("%s %s: %w", flag, path, err)
			}
		}
		return &pendingFile{flag: flag, target: target, f: f}, nil
	}
	return nil, fmt.Errorf("%s %s: cannot create a temporary file in %s", flag, path, dir)
}

// maxLinks bounds the symbolic links linkTarget follows, as Linux's
// ELOOP limit for a path's links does (40).
const maxLinks = 40

// linkTarget returns the file path names once its symbolic links are
// followed: path itself when it is no link or does not exist, else the end
// of its chain of links, which need not exist (a dangling link names the
// file to create, as os.Create would). A link's relative target is read
// from the link's directory (its own links resolved). More than maxLinks links fail.
func linkTarget(path string) (string, error) {
	for range maxLinks {
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Mode()&fs.ModeSymlink == 0) {
			return path, nil
		}
		if err != nil {
			return "", err
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(dest) {
			// The link's directory resolved first, so that a ".." in dest
			// climbs from where the link really is.
			dir, err := filepath.EvalSymlinks(filepath.Dir(path))
			if err != nil {
				return "", err
			}
			dest = filepath.Join(dir, dest)
		}
		path = dest
	}
	return "", fmt.Errorf("more than %d symbolic links, or a loop of them", maxLinks)
}

// stdStream names the router's standard stream ("input", "output" or
// "error") that is the file fi, or returns "". A stream redirected to a
// regular file is reachable by path (/dev/stdout, /proc/self/fd/1), and
// renaming an output over that path would replace the file: an appended
// log, or the trace read from stdin, would be lost.
func stdStream(fi fs.FileInfo) string {
	for _, s := range []struct {
		f    *os.File
		name string
	}{{os.Stdin, "input"}, {os.Stdout, "output"}, {os.Stderr, "error"}} {
		if sfi, err := s.f.Stat(); err == nil && os.SameFile(fi, sfi) {
			return s.name
		}
	}
	return ""
}

// Write writes to the temporary file.
func (p *pendingFile) Write(b []byte) (int, error) { return p.f.Write(b) }

// commit flushes the temporary file to disk and renames it over the
// target. On error the temporary is removed and the target is untouched.
// An output to stdout is copied there instead.
func (p *pendingFile) commit() error {
	if p.done {
		return errors.New(p.flag + ": output already finished")
	}
	p.done = true
	if p.stdout != nil {
		defer p.f.Close()
		_, err := p.f.Seek(0, io.SeekStart)
		if err == nil {
			_, err = io.Copy(p.stdout, p.f)
		}
		if err != nil {
			return fmt.Errorf("%s -: writing to standard output: %w", p.flag, err)
		}
		return nil
	}
	name := p.f.Name()
	err := p.f.Sync()
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, p.target)
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("%s %s: %w", p.flag, p.target, err)
	}
	return nil
}

// abort closes and removes the temporary file, leaving the target as it
// was. It is a no-op after commit or a previous abort, so it can be
// deferred.
func (p *pendingFile) abort() {
	if p == nil || p.done {
		return
	}
	p.done = true
	p.f.Close()
	if p.stdout == nil { // stdout's temporary has no name any more
		os.Remove(p.f.Name())
	}
}

// samePath reports whether a and b name the same file: equal once made
// absolute and cleaned, or, when both exist, the same file by os.SameFile
// (which sees through symbolic and hard links).
func samePath(a, b string) bool {
	aa, errA := filepath.Abs(a)
	ab, errB := filepath.Abs(b)
	if errA == nil && errB == nil && aa == ab {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// createOutput is createPending for an output flag's path, or, for "-",
// a pending output to stdout: its content is held in an unnamed temporary
// file (created in os.TempDir and removed at once, so nothing is left
// behind even on SIGKILL) and copied to stdout by commit, so standard
// output, like a file, gets the output only when the whole run succeeds.
// A file named "-" is never created.
func createOutput(flag, path string, stdout io.Writer) (*pendingFile, error) {
	if path != "-" {
		return createPending(flag, path)
	}
	f, err := os.CreateTemp("", ".router-output-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("%s -: cannot create a temporary file to hold standard output's content: %w", flag, err)
	}
	_ = os.Remove(f.Name()) // the open file stays readable
	return &pendingFile{flag: flag, target: "-", f: f, stdout: stdout}, nil
}
