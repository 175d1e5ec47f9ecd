package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard-router/switchyard/router/trace/bundled"
)

// pendingFile is an output file written atomically: the content goes to a
// temporary file in the target's directory (".NAME.PID.RAND.tmp": the
// target's name, this process's id, a random base-36 number), which commit
// renames over the target and abort removes. Until commit the target is
// untouched, and a reader never sees a partly written file. A process
// killed by SIGKILL cannot remove its temporary; the next run writing the
// same target does (removeStaleTemps).
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
//
// An existing, non-empty target is replaced only when it holds what the
// flag writes (kind; see holdsKind): the router's own earlier output, so a
// rerun replaces it but a trace, a policy file, a workers file or any other
// file is never lost.
func createPending(flag, path string, kind outputKind) (*pendingFile, error) {
	var perm fs.FileMode = 0o644
	// Stat follows links as the kernel does, /proc's too (/dev/stdout to a
	// pipe reads "pipe:[N]" as a link but is the pipe).
	if fi, err := os.Stat(path); err == nil {
		switch {
		case fi.IsDir():
			return nil, fmt.Errorf("%s %s: is a directory, want a file", flag, path)
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("%s %s: not a regular file (outputs are written to a temporary file and renamed over the target); for standard output use %s -", flag, path, flag)
		}
		if name := stdStream(fi); name != "" {
			return nil, fmt.Errorf("%s %s: is the router's standard %s (a file it was redirected to), which the output would replace, not write to; use %s - for standard output, or name another file", flag, path, name, flag)
		}
		if fi.Size() > 0 {
			if err := checkReplaceable(flag, path, kind); err != nil {
				return nil, err
			}
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
	pid := strconv.Itoa(os.Getpid())
	for range 100 {
		name := filepath.Join(dir, "."+base+"."+pid+"."+strconv.FormatUint(uint64(rand.Uint32()), 36)+".tmp")
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
		if fi, err := f.Stat(); err == nil {
			removeStaleTemps(dir, base, fi.ModTime())
		}
		return &pendingFile{flag: flag, target: target, f: f}, nil
	}
	return nil, fmt.Errorf("%s %s: cannot create a temporary file in %s", flag, path, dir)
}

// staleTempAge is how much older than this run's own temporary a
// temporary of a process that is gone must be before removeStaleTemps
// removes it: a margin for clocks (of a network file system's server and
// its clients) that disagree by a little.
const staleTempAge = 5 * time.Second

// removeStaleTemps removes the temporaries of target base in dir that a
// killed run left (a SIGKILL cannot be caught, so the run could not): a
// file is removed only when its name is exactly ".BASE.PID.RAND.tmp" (PID
// decimal, RAND base 36: createPending's pattern), it is a regular file
// (not a link), its modification time is at least staleTempAge before
// ours (the modification time of this run's own new temporary, so no clock
// but the file system's is read), and no process PID exists (processGone).
// Anything else, another target's temporary, a live process's, is left
// alone. Errors are ignored: a temporary left is harmless, and the output
// itself does not depend on it. The directory is read in batches: work
// linear in its entries.
func removeStaleTemps(dir, base string, ours time.Time) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	defer d.Close()
	for {
		names, err := d.Readdirnames(256)
		for _, name := range names {
			pid, ok := tempPID(name, base)
			if !ok {
				continue
			}
			path := filepath.Join(dir, name)
			fi, err := os.Lstat(path)
			if err != nil || !fi.Mode().IsRegular() || ours.Sub(fi.ModTime()) < staleTempAge || !processGone(pid) {
				continue
			}
			_ = os.Remove(path)
		}
		if err != nil {
			return // io.EOF at the end
		}
	}
}

// processGone reports whether no process pid exists: kill(pid, 0) fails
// with ESRCH (a process of another user, EPERM, or a zombie exists).
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// tempPID returns PID when name is a temporary of target base in
// createPending's pattern ".BASE.PID.RAND.tmp" (PID a positive decimal
// without leading zeros, RAND one or more of [0-9a-z]), else false.
func tempPID(name, base string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "."+base+".")
	if !ok {
		return 0, false
	}
	if rest, ok = strings.CutSuffix(rest, ".tmp"); !ok {
		return 0, false
	}
	num, rnd, ok := strings.Cut(rest, ".")
	if !ok || rnd == "" || num == "" || num[0] == '0' || len(num) > 10 {
		return 0, false
	}
	for _, c := range rnd {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return 0, false
		}
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	pid, err := strconv.Atoi(num)
	return pid, err == nil && pid > 0
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
func createOutput(flag, path string, kind outputKind, stdout io.Writer) (*pendingFile, error) {
	if path != "-" {
		return createPending(flag, path, kind)
	}
	f, err := os.CreateTemp("", ".router-output-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("%s -: cannot create a temporary file to hold standard output's content: %w", flag, err)
	}
	_ = os.Remove(f.Name()) // the open file stays readable
	return &pendingFile{flag: flag, target: "-", f: f, stdout: stdout}, nil
}

// The output rule. No output replaces a trace, a policy file or a workers
// file, and a rerun may replace its own earlier output. Two checks make it:
//
//   - By identity (checkOutputPaths, before any work): an output may not be
//     any input of the run (however spelt: samePath sees through symbolic
//     and hard links), nor a file a bundled default was built from
//     (bundledSources), nor a trace the repository ships (listed in a
//     checkout's testdata/traces/SHA256SUMS: shippedTraceFiles), nor
//     another output of the run.
//   - By content (createPending, for every output): an existing, non-empty
//     file is replaced only when it holds what the flag writes (holdsKind).
//
// The content check is an allow-list on purpose. The opposite rule, refusing
// files that parse as a trace, a policy file or a workers file, would have to
// recognise every format those come in (Mooncake JSONL, three CSV layouts,
// gzipped or not, HCL and HCL's JSON syntax) and every future one, and would
// let through anything it failed to recognise; the allow-list fails safe: a
// file the router cannot tell is its own is kept, and the error says to
// choose another file or remove it first. The identity check covers what
// content cannot: an input that is empty or happens to look like an output,
// and two outputs of one run naming one file.

// outputKind is what an output flag writes; an existing file is replaced
// only when it holds the same kind (holdsKind).
type outputKind int

const (
	// kindReport is router replay --report: a JSON object (report.Report),
	// or an array of them, with every member report.Report always writes
	// up to "rejected" (reportMembers), so that a hand-made JSON file with
	// a "policy" and a "trace" is not taken for one.
	kindReport outputKind = iota
	// kindHTML is router replay --html: an HTML document
	// (htmlreport.Write), "<!DOCTYPE html>" first, whose head carries the
	// generator marker generatorMeta, so that another HTML page is
	// not taken for one.
	kindHTML
	// kindPerRequest is router replay --per-request: JSON lines of
	// replay.Outcome, whose first line has every member an Outcome always
	// writes (outcomeMembers).
	kindPerRequest
	// kindGeneratedTrace is router trace generate --out: Mooncake JSON
	// lines whose first line has exactly the members synth.WriteJSONL
	// writes, timestamp, input_length, output_length, hash_ids and
	// session_id, with a session_id of the form "s<N>". Recorded Mooncake
	// traces carry no session_id (testdata/traces/README.md), so they are
	// never taken for one; a trace written elsewhere in exactly this shape
	// would be.
	kindGeneratedTrace
)

// String names the kind in messages: what the flag writes.
func (k outputKind) String() string {
	switch k {
	case kindReport:
		return "a router replay JSON report"
	case kindHTML:
		return "a router replay HTML report"
	case kindPerRequest:
		return "router replay per-request JSON lines"
	case kindGeneratedTrace:
		return "a trace written by router trace generate"
	}
	return "router output"
}

// sniffLimit bounds what holdsKind reads of an existing file: 256 KiB,
// more than the first record of any output kind (a report's "speeds" of
// replay.MaxWorkers workers, which precede "requests", take at most about
// 100 KiB), so the check costs the same for a 3 MB trace as for an empty
// file.
const sniffLimit = 256 << 10

// checkReplaceable refuses, naming flag and path, an existing file at path
// that does not hold kind.
func checkReplaceable(flag, path string, kind outputKind) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	defer f.Close()
	head, err := io.ReadAll(io.LimitReader(f, sniffLimit))
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	if holdsKind(head, kind) {
		return nil
	}
	return fmt.Errorf("%s %s: the file exists and is not %s, which is all %s replaces (no output replaces a trace, a policy file or a workers file); choose another file, or remove this one first",
		flag, path, kind, flag)
}

// holdsKind reports whether head, the first bytes (at most sniffLimit) of
// a file, begins as output of kind does.
func holdsKind(head []byte, kind outputKind) bool {
	switch kind {
	case kindHTML:
		h := bytes.TrimLeft(bytes.TrimPrefix(head, []byte("\xef\xbb\xbf")), " \t\r\n")
		const doctype = "<!doctype html"
		if len(h) < len(doctype) || !bytes.EqualFold(h[:len(doctype)], []byte(doctype)) {
			return false
		}
		// The marker in the document's head, before its body.
		end := bytes.Index(h, []byte("<body"))
		if end < 0 {
			end = len(h)
		}
		return bytes.Contains(h[:end], []byte(generatorMeta))
	case kindReport:
		return reportHead(head)
	case kindPerRequest:
		m, ok := firstLine(head)
		return ok && hasMembers(m, outcomeMembers)
	case kindGeneratedTrace:
		m, ok := firstLine(head)
		if !ok || len(m) != 5 {
			return false
		}
		for _, k := range []string{"timestamp", "input_length", "output_length"} {
			if !isNumber(m[k]) {
				return false
			}
		}
		var ids []int64
		var sid string
		if json.Unmarshal(m["hash_ids"], &ids) != nil || json.Unmarshal(m["session_id"], &sid) != nil {
			return false
		}
		n, ok := strings.CutPrefix(sid, "s")
		_, err := strconv.ParseUint(n, 10, 64)
		return ok && err == nil
	}
	return false
}

// generatorMeta is the marker of router replay's HTML report: the meta
// element the page template of package htmlreport
// (router/replay/report/htmlreport/template.go) writes in its head.
// TestOutputRerunReplacesOwnOutput fails if the two part.
const generatorMeta = `<meta name="generator" content="switchyard router replay">`

// jsonType is the type a JSON member must have.
type jsonType int

const (
	jsonNumber jsonType = iota
	jsonString
)

// member is a JSON member an output always writes, and its type.
type member struct {
	name string
	typ  jsonType
}

// outcomeMembers are the members replay.Outcome always writes (its fields
// without omitempty): a per-request line has every one of them.
var outcomeMembers = []member{
	{"index", jsonNumber}, {"arrival_ms", jsonNumber}, {"worker", jsonNumber},
	{"input_length", jsonNumber}, {"output_length", jsonNumber},
	{"overlap_blocks", jsonNumber}, {"cached_tokens", jsonNumber},
	{"queue_ms", jsonNumber}, {"ttft_ms", jsonNumber}, {"e2e_ms", jsonNumber},
	{"status", jsonString},
}

// reportMembers are the members report.Report always writes (no
// omitempty) up to "rejected", in its order: the fields that precede its
// maps of any size (rejection_reasons), so they lie within sniffLimit.
var reportMembers = []member{
	{"policy", jsonString}, {"trace", jsonString}, {"workers", jsonNumber},
	{"requests", jsonNumber}, {"completed", jsonNumber}, {"rejected", jsonNumber},
}

// hasMembers reports whether m has every member of want, of its type.
func hasMembers(m map[string]json.RawMessage, want []member) bool {
	for _, w := range want {
		if !isType(m[w.name], w.typ) {
			return false
		}
	}
	return true
}

// isType reports whether v is a JSON value of type t.
func isType(v json.RawMessage, t jsonType) bool {
	switch t {
	case jsonNumber:
		return isNumber(v)
	case jsonString:
		var s string
		return len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil
	}
	return false
}

// firstLine decodes head's first line as a JSON object.
func firstLine(head []byte) (map[string]json.RawMessage, bool) {
	sc := bufio.NewScanner(bytes.NewReader(head))
	sc.Buffer(nil, sniffLimit)
	if !sc.Scan() {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(sc.Bytes(), &m) != nil {
		return nil, false
	}
	return m, true
}

// isNumber reports whether v is a JSON number.
func isNumber(v json.RawMessage) bool {
	var f float64
	return len(v) > 0 && v[0] != '"' && json.Unmarshal(v, &f) == nil
}

// reportHead reports whether head begins as a JSON report does: an object
// with every member of reportMembers, of its type, or an array that is
// empty or whose first element is such an object. A policy file in HCL's
// JSON syntax has "policy" too, but as an object (a block), not a string;
// a hand-made summary with "policy" and "trace" lacks the counts.
func reportHead(head []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(head))
	tok, err := dec.Token()
	if err != nil {
		return false
	}
	if tok == json.Delim('[') {
		if !dec.More() {
			tok, err := dec.Token()
			return err == nil && tok == json.Delim(']')
		}
		if tok, err = dec.Token(); err != nil {
			return false
		}
	}
	if tok != json.Delim('{') {
		return false
	}
	seen := make(map[string]json.RawMessage, len(reportMembers))
	for dec.More() && len(seen) < len(reportMembers) {
		k, err := dec.Token()
		if err != nil {
			return false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return false
		}
		for _, w := range reportMembers {
			if k == w.name {
				if !isType(v, w.typ) {
					return false
				}
				seen[w.name] = v
			}
		}
	}
	return len(seen) == len(reportMembers)
}

// namedPath is a file a flag names: an input or an output of a run.
type namedPath struct{ flag, path string }

// checkOutputPaths refuses an output that is an input of the run (inputs),
// a file a bundled default was built from (bundledSources), a trace the
// repository ships (shippedTraceFiles), or another output (outputs, in
// flag order). An empty path or "-" (standard input or
// output) names no file and is skipped. Every error names the output's
// flag and path and the file it would replace.
func checkOutputPaths(outputs, inputs []namedPath) error {
	var outs []namedPath
	for _, o := range outputs {
		if o.path != "" && o.path != "-" {
			outs = append(outs, o)
		}
	}
	if len(outs) == 0 {
		return nil
	}
	sources := bundledSourceFiles()
	shipped := shippedTraceFiles()
	for i, out := range outs {
		for _, in := range inputs {
			if in.path != "" && in.path != "-" && samePath(out.path, in.path) {
				return fmt.Errorf("%s %s is the %s input %s: choose another output file", out.flag, out.path, in.flag, in.path)
			}
		}
		for _, src := range sources {
			if samePath(out.path, src.path) {
				return fmt.Errorf("%s %s is the file %s was built from (%s): choose another output file", out.flag, out.path, src.flag, src.path)
			}
		}
		for _, tr := range shipped {
			if samePath(out.path, tr.path) {
				return fmt.Errorf("%s %s is %s (%s): choose another output file", out.flag, out.path, tr.flag, tr.path)
			}
		}
		for _, other := range outs[i+1:] {
			if samePath(out.path, other.path) {
				return fmt.Errorf("%s %s and %s %s are the same file: choose two files", out.flag, out.path, other.flag, other.path)
			}
		}
	}
	return nil
}

// bundledSources are the repository's files that defaults built into the
// binary were made from, by module-relative path: the bundled trace
// (package router/trace/bundled embeds the gzipped copy of
// testdata/traces' file). The built-in default policy is Go code
// (config.DefaultPolicyName), with no file behind it, and no workers file is
// bundled.
var bundledSources = []struct{ what, path string }{
	{"the bundled default trace", filepath.Join("testdata", "traces", bundled.Name)},
	{"the bundled default trace", filepath.Join("router", "trace", "bundled", bundled.Name+".gz")},
}

// modulePath is the module whose checkout holds bundledSources.
const modulePath = "github.com/switchyard-router/switchyard"

// shippedSums is the checksum list of the traces the repository ships, by
// module-relative path: every file it lists, in its directory, is
// protected (testdata/traces/README.md).
var shippedSums = filepath.Join("testdata", "traces", "SHA256SUMS")

// maxSumsBytes bounds what shippedTraceFiles reads of a SHA256SUMS: 64 KiB,
// some 600 lines of sha256sum's format.
const maxSumsBytes = 64 << 10

// shippedTraceFiles returns the files listed in shippedSums of each
// checkout of the module found above the working directory or above the
// running binary (as bundledSourceFiles finds them), that exist, with flag
// saying what the file is. A line of shippedSums is sha256sum's output:
// 64 hex digits, a space, a space or "*" (binary mode), the file name
// relative to the list's directory; other lines are skipped.
func shippedTraceFiles() []namedPath {
	var out []namedPath
	for _, root := range checkoutRoots() {
		sums := filepath.Join(root, shippedSums)
		b, err := readHead(sums, maxSumsBytes)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			line = strings.TrimRight(line, "\r\n")
			if len(line) < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*') {
				continue
			}
			name := line[66:]
			p := filepath.Join(filepath.Dir(sums), filepath.FromSlash(name))
			if _, err := os.Stat(p); err == nil {
				out = append(out, namedPath{"a trace the repository ships, listed in " + shippedSums, p})
			}
		}
	}
	return out
}

// checkoutRoots returns the checkouts of the module (moduleRoots) above
// the working directory and above the running binary (bin/router in a
// checkout).
func checkoutRoots() []string {
	var roots []string
	if wd, err := os.Getwd(); err == nil {
		roots = append(roots, moduleRoots(wd)...)
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			roots = append(roots, moduleRoots(filepath.Dir(exe))...)
		}
	}
	return roots
}

// bundledSourceFiles returns the bundledSources that exist (flag holds
// what the file is the source of), with their path
// as seen from the working directory: relative to it, and relative to
// each checkout of the module found above it or above the running binary
// (bin/router in a checkout), whichever exist.
func bundledSourceFiles() []namedPath {
	roots := append([]string{"."}, checkoutRoots()...)
	var out []namedPath
	for _, root := range roots {
		for _, src := range bundledSources {
			p := filepath.Join(root, src.path)
			if _, err := os.Stat(p); err == nil {
				out = append(out, namedPath{src.what, p})
			}
		}
	}
	return out
}

// moduleRoots returns the directories from dir up to the file system's
// root (at most 64 levels) that hold a go.mod declaring modulePath.
func moduleRoots(dir string) []string {
	var roots []string
	for range 64 {
		if b, err := readHead(filepath.Join(dir, "go.mod"), 4096); err == nil && declaresModule(b) {
			roots = append(roots, dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return roots
}

// declaresModule reports whether gomod, a go.mod's first bytes, declares
// modulePath.
func declaresModule(gomod []byte) bool {
	for line := range strings.Lines(string(gomod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == modulePath
		}
	}
	return false
}

// readHead reads at most n bytes of the regular file path.
// (Stat first, so that a named pipe is never opened: opening one blocks.)
func readHead(path string, n int64) ([]byte, error) {
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}
