// Package benchproc starts and stops the processes of the benchmark
// programs under bench/ and reads their metrics.
package benchproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard-router/switchyard/internal/portowner"
)

// DebugNumber GETs http://addr+path (a Go pprof page of the process's
// --debug-listen, such as /debug/pprof/heap?debug=1&gc=1), reads at most
// limit bytes and returns the number re's first group matches in them.
func DebugNumber(ctx context.Context, c *http.Client, addr, path string, limit int64, re *regexp.Regexp) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, err
	}
	m := re.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("%s: no match of %s", path, re)
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}

// Scrape reads base's /metrics into series -> value (the text format's
// "name{labels}" as written, comments skipped).
func Scrape(c *http.Client, base string) (map[string]float64, error) {
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				m[line[:i]] = v
			}
		}
	}
	return m, sc.Err()
}

// Lines the router's processes print with an address they bound (given
// port 0), for Start and StartAll.
var (
	// ServeProfiler is `router serve`'s --debug-listen line; group 1 is
	// host:port.
	ServeProfiler = regexp.MustCompile(`router serve profiler on http://(\S+)/debug/pprof/`)
	// MockKVEvents is `router mock-worker`'s line for rank 0's KV events
	// publisher (--kv-events-endpoint); group 1 is tcp://host:port.
	MockKVEvents = regexp.MustCompile(`mock-worker rank 0 KV events on (tcp://\S+)`)
)

// Children are the processes a bench started, stopped in reverse order
// (StopAll). Each is SIGKILLed by the kernel if the bench dies (Linux).
type Children struct{ list []*child }

type child struct {
	cmd  *exec.Cmd
	addr string // Start's answer
	done chan struct{}
}

// Start runs bin args with stderr to logPath and waits (30 s at most) for
// the stdout line matching re, returning its first group. Give a child
// port 0 (--listen 127.0.0.1:0) and re its "listening on" line: the
// address is then that child's own socket, which no other process can
// hold while the child lives. Errors: the child could not start, exited
// first (quoting its log, and naming the process that holds a port its
// bind found taken: portowner.Of), printed no match in time, or ctx ended.
func (cs *Children) Start(ctx context.Context, logPath string, re *regexp.Regexp, bin string, args ...string) (string, error) {
	got, err := cs.StartAll(ctx, logPath, []*regexp.Regexp{re}, bin, args...)
	if err != nil {
		return "", err
	}
	return got[0], nil
}

// StartAll is Start waiting for a stdout line matching each of res (in
// any order; the first line matching each counts), returning their first
// groups in res's order: a mock worker's HTTP address and its KV events'
// address, say. The child is known to Kill, Pid, Signal and Wait by the
// first. Errors: as Start's.
func (cs *Children) StartAll(ctx context.Context, logPath string, res []*regexp.Regexp, bin string, args ...string) ([]string, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = lf
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	cs.list = append(cs.list, c)
	found := make(chan []string, 1)
	go func() {
		got, n := make([]string, len(res)), 0
		seen := make([]bool, len(res))
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if n == len(res) {
				continue // keep reading: the child must not block on a full pipe
			}
			for i, re := range res {
				if m := re.FindStringSubmatch(sc.Text()); m != nil && !seen[i] {
					got[i], seen[i] = m[1], true
					if n++; n == len(res) {
						found <- got
					}
				}
			}
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	name := filepath.Base(bin)
	if len(args) > 0 {
		name += " " + args[0]
	}
	select {
	case got := <-found:
		c.addr = got[0]
		return got, nil
	case <-c.done:
		select {
		case got := <-found: // matched, then exited at once
			c.addr = got[0]
			return got, nil
		default:
		}
		b, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s (pid %d) exited before listening: %s%s", name, cmd.Process.Pid, b, portowner.TakenNote(b))
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("%s (pid %d) did not print %v within 30 s", name, cmd.Process.Pid, res)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// StopAll stops every child: SIGTERM, then SIGKILL after 5 s.
func (cs *Children) StopAll() {
	for i := len(cs.list) - 1; i >= 0; i-- {
		c := cs.list[i]
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	cs.list = nil
}

// Kill SIGKILLs the child whose Start answered addr, waits until it has
// exited and forgets it. Errors: no running child answered addr.
func (cs *Children) Kill(addr string) error {
	for i, c := range cs.list {
		if c.addr != addr {
			continue
		}
		if err := c.cmd.Process.Kill(); err != nil {
			return err
		}
		<-c.done
		cs.list = append(cs.list[:i], cs.list[i+1:]...)
		return nil
	}
	return fmt.Errorf("no child listening on %s", addr)
}

// Pid returns the process id of the running child whose Start answered
// addr; false when there is none.
func (cs *Children) Pid(addr string) (int, bool) {
	for _, c := range cs.list {
		if c.addr == addr {
			return c.cmd.Process.Pid, true
		}
	}
	return 0, false
}

// Signal sends sig to the running child whose Start answered addr.
// Errors: no running child answered addr; the signal failed.
func (cs *Children) Signal(addr string, sig os.Signal) error {
	for _, c := range cs.list {
		if c.addr == addr {
			return c.cmd.Process.Signal(sig)
		}
	}
	return fmt.Errorf("no child listening on %s", addr)
}

// Wait waits up to timeout for the child whose Start answered addr to
// exit, forgets it, and returns its exit code (-1 when a signal killed
// it). Errors: no running child answered addr; it did not exit in time
// (it is then left running).
func (cs *Children) Wait(addr string, timeout time.Duration) (int, error) {
	for i, c := range cs.list {
		if c.addr != addr {
			continue
		}
		select {
		case <-c.done:
		case <-time.After(timeout):
			return 0, fmt.Errorf("%s did not exit within %v", addr, timeout)
		}
		cs.list = append(cs.list[:i], cs.list[i+1:]...)
		return c.cmd.ProcessState.ExitCode(), nil
	}
	return 0, fmt.Errorf("no child listening on %s", addr)
}

// PostChat posts body to base's /v1/chat/completions and reads the
// answer; a status other than 200 is an error quoting the answer.
func PostChat(ctx context.Context, c *http.Client, base string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", base, resp.Status, b)
	}
	return nil
}
