package supervisor

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/internal/pluginclient"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// Stopping a plugin: closing its client and go-plugin's graceful Kill get
// gracefulKill each before the process group is killed; killWait bounds
// the whole stop, and a step still running then makes the stop return an
// error. killWait is a variable so that the tests can make it generous:
// on a machine starved for seconds a step can outlast 5 s.
const gracefulKill = 500 * time.Millisecond

var killWait = 5 * time.Second

// supportedAPIVersions are the plugin API versions this host speaks.
var supportedAPIVersions = []uint32{shared.APIVersion}

// counters are one plugin's call statistics.
type counters struct {
	calls, errors, timeouts, fallbacks, restarts atomic.Int64
	// eventsDropped: lifecycle events for the plugin dropped while no
	// process served it (restarting, failed, shut down).
	eventsDropped atomic.Int64
}

// proc is one running plugin process and its go-plugin client.
type proc struct {
	name         string
	startTimeout time.Duration
	callTimeout  time.Duration
	log          hclog.Logger
	client       *plugin.Client
	rc           *pluginclient.Client
	conn         *grpc.ClientConn // the plugin's connection, for health checks
	pid          int              // also the process group id; 0 when the binary never ran
	sockDir      string           // the private socket directory, removed by stop
	sockLock     io.Closer        // holds sockDir's lock (sockdir.go); nil: unlocked
	files        []FileSum        // the checksums of the files it runs, taken before it started
	version      string           // DescribeResponse.plugin_version
	stderr       *tail
	exitR        *os.File // the exit pipe's read end, closed by stop
	// expectedP99 is the Decide p99 the plugin declared (Describe).
	expectedP99 time.Duration

	// addr is the handshake's address once it is accepted (a unix socket
	// or a loopback TCP address); nil before, or when it was refused. The
	// gRPC dialer connects only to it.
	addr atomic.Pointer[net.Addr]
	// stdoutTooLong: the first line on stdout, where the handshake line
	// belongs, was over bufio.MaxScanTokenSize (cmdRunner.relayStdout).
	stdoutTooLong atomic.Bool
	// runner runs the process for go-plugin and relays its stdout; nil
	// until go-plugin's Start made it.
	runner atomic.Pointer[cmdRunner]
	// started is closed once go-plugin's Start has returned and pid and
	// pidWatched are set.
	started chan struct{}
	// pidWatched: watchPID watches the process (Linux, pidfd), so the
	// exit pipe's end-of-file is not needed to see its exit.
	pidWatched bool

	// stopGrace is Options.StopGrace; onStopped Options.Stopped.
	stopGrace time.Duration
	onStopped func(StopReport)

	// breaker is this process's circuit breaker (nil: none).
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]
	// checkNow asks the health probe for a check at once (a call missed
	// its deadline); it holds at most one request.
	checkNow chan struct{}
	// lastTimeout is the deadline, in monoBase nanoseconds, of the last
	// call timeout the circuit breaker counted (countTimeout).
	lastTimeout atomic.Int64
	// upSince is when the host adopted the process (managed.adopt).
	upSince time.Time
	// stallSince is when the earliest decision call that timed out with no
	// answer on the Decide stream since was sent (managed.checkStall); nil
	// or a time before the last answer: no stall.
	stallSince atomic.Pointer[time.Time]
	// killReason says why the host killed the process, when it did.
	killReason atomic.Pointer[string]
	// cmd is the process's command; its ProcessState is read once
	// go-plugin's Kill returned (go-plugin has waited for it by then).
	cmd *exec.Cmd
	bg  sync.WaitGroup // the health probe

	// ctx is cancelled when the process exits or stop begins; every call's
	// context is cancelled with it.
	ctx    context.Context
	cancel context.CancelFunc
	// exited is closed when the process has exited: the exit pipe it
	// holds (fd 3) reached EOF.
	exited   chan struct{}
	exitOnce sync.Once

	stopOnce sync.Once
	stopErr  error

	mu       sync.Mutex
	closing  bool
	inflight int
	drained  chan struct{}
}

// launch starts the plugin b describes, completes the go-plugin handshake
// and Describes it. On any failure the process (group) is killed and the
// socket directory removed before it returns a *StartError.
func (h *Host) launch(ctx context.Context, b config.Plugin) (*proc, *pluginclient.Description, error) {
	fail := func(permanent bool, err error) error {
		return &StartError{Plugin: b.Name, Cause: err, Permanent: permanent}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fail(false, err)
	}
	startTimeout := b.StartTimeout
	if startTimeout <= 0 {
		startTimeout = config.DefaultStartTimeout
	}
	callTimeout := b.CallTimeout
	if callTimeout <= 0 {
		callTimeout = config.DefaultCallTimeout
	}
	if b.Command == "" {
		return nil, nil, fail(true, errors.New("no command"))
	}
	path := b.Path
	if path == "" {
		path = b.Command
	}
	if !filepath.IsAbs(path) {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, nil, fail(true, fmt.Errorf("resolving command %q: %w", b.Command, err))
		}
		path = abs
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, nil, fail(true, fmt.Errorf("command %s %w, not an executable file", path, config.ErrCommandIsDirectory))
	}
	var secure *plugin.SecureConfig
	if b.SHA256 != "" {
		sum, err := hex.DecodeString(b.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, nil, fail(true, fmt.Errorf("sha256 %q is not 64 hex digits", b.SHA256))
		}
		secure = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}

	// The files it runs, hashed before it runs: what /readyz and the
	// metrics show, and what sha256_files pins.
	sums := fileSums(b)
	if err := checkPins(b, sums); err != nil {
		return nil, nil, fail(true, err)
	}

	sweepOnce.Do(func() { h.sweepSocketDirs() })
	dir, sockLock, err := socketDir()
	if err != nil {
		return nil, nil, fail(false, fmt.Errorf("creating the socket directory: %w", err))
	}
	exitR, exitW, err := os.Pipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		if sockLock != nil {
			_ = sockLock.Close()
		}
		return nil, nil, fail(false, fmt.Errorf("creating the exit pipe: %w", err))
	}

	cmd := exec.Command(path, b.Args...)
	cmd.Env = environ(b.Env, b.PassEnv, dir)
	cmd.SysProcAttr = sysProcAttr()
	// The child holds the pipe's write end as fd 3; EOF on the read end
	// tells us it exited without polling go-plugin.
	cmd.ExtraFiles = []*os.File{exitW}

	log := h.log.Named(b.Name)
	p := &proc{
		name:         b.Name,
		startTimeout: startTimeout,
		callTimeout:  callTimeout,
		log:          log,
		sockDir:      dir,
		sockLock:     sockLock,
		files:        sums,
		stderr:       newTail(),
		exitR:        exitR,
		exited:       make(chan struct{}),
		started:      make(chan struct{}),
		checkNow:     make(chan struct{}, 1),
		stopGrace:    h.stopGrace,
		onStopped:    h.onStopped,
		cmd:          cmd,
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  shared.Handshake(),
		VersionedPlugins: pluginclient.PluginSets(h.clientOptions(b.Name, p)),
		// go-plugin's runner for a Cmd, but for stdout (cmdRunner); the
		// sha256 is checked here, as go-plugin checks a Cmd's.
		RunnerFunc: func(_ hclog.Logger, gcmd *exec.Cmd, tmpDir string) (runner.Runner, error) {
			// go-plugin made tmpDir for a socket, inside dir; the plugin
			// gets dir itself (environ), which the SDK removes at its
			// parent's death only when it holds nothing but sockets.
			_ = os.Remove(tmpDir)
			if secure != nil {
				ok, err := secure.Check(path)
				if err != nil {
					return nil, fmt.Errorf("error verifying checksum: %w", err)
				}
				if !ok {
					return nil, plugin.ErrChecksumsDoNotMatch
				}
			}
			cmd.Stdin = gcmd.Stdin
			r, err := newCmdRunner(cmd, path, gcmd.Env, log, func() { p.stdoutTooLong.Store(true) })
			if err != nil {
				return nil, err
			}
			r.stray = h.strayStdout
			p.runner.Store(r)
			return r, nil
		},
		StartTimeout:     startTimeout,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		// go-plugin's own messages go to log; the plugin's stderr lines
		// are logged by stderrLog (see there why not by go-plugin).
		Logger:           quietStderr{Logger: log, stderrName: filepath.Base(path), p: p},
		Stderr:           io.MultiWriter(p.stderr, newStderrLog(log)),
		SkipHostEnv:      true,
		SyncStdout:       h.stdout,
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: dir},
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithDefaultCallOptions(
				grpc.MaxCallRecvMsgSize(shared.MaxMessageBytes),
				grpc.MaxCallSendMsgSize(shared.MaxMessageBytes),
			),
			// Replaces go-plugin's dialer, which would connect to
			// whatever address the handshake gave.
			grpc.WithContextDialer(p.dial),
		},
	})
	go p.watchExitPipe()

	var addr net.Addr
	err = startPinned(func() error {
		var err error
		addr, err = p.client.Start()
		return err
	}, p.exited)
	_ = exitW.Close()
	if cmd.Process != nil {
		p.pid = cmd.Process.Pid
	}
	if err == nil && p.pid > 0 {
		// A descendant of the plugin may hold the exit pipe (or its
		// stderr, which holds up go-plugin's own exit detection), and
		// the plugin may close its own end: watch the process itself
		// too.
		p.pidWatched = watchPID(p.pid, p.markExited)
	}
	close(p.started)
	if err == nil {
		if err = checkAddr(addr); err == nil {
			p.addr.Store(&addr)
		}
	}
	if err != nil {
		stopErr := p.stop()
		cause, permanent := p.handshakeCause(err, path, b.SHA256, startTimeout)
		return nil, nil, fail(permanent, errors.Join(cause, stopErr))
	}

	// The handshake is done; anything failing from here on fails Describe.
	failStarted := func(permanent bool, err error) (*proc, *pluginclient.Description, error) {
		if p.ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)%s", pluginclient.ErrPluginClosed, err, p.stderr.suffix())
		}
		return nil, nil, fail(permanent, errors.Join(err, p.stop()))
	}
	// go-plugin's Client opens its stdio stream, which waits for the
	// HTTP/2 handshake: a plugin that listens but does not speak gRPC
	// would hold it for gRPC's connect timeout (20 s), so it is bounded
	// by start_timeout too (stopping the process ends the wait).
	type connected struct {
		rpc plugin.ClientProtocol
		err error
	}
	conn := make(chan connected, 1)
	go func() {
		rpc, err := p.client.Client()
		conn <- connected{rpc, err}
	}()
	timer := time.NewTimer(startTimeout)
	var c connected
	select {
	case c = <-conn:
		timer.Stop()
	case <-timer.C:
		return failStarted(false, fmt.Errorf("no gRPC connection within start_timeout (%v): the plugin accepted the connection but did not speak gRPC (HTTP/2)%s", startTimeout, p.stderr.suffix()))
	}
	rpc, err := c.rpc, c.err
	if err != nil {
		return failStarted(false, fmt.Errorf("connecting: %w", err))
	}
	raw, err := rpc.Dispense(shared.PluginSetKey)
	if err != nil {
		return failStarted(true, fmt.Errorf("dispensing %q: %w", shared.PluginSetKey, err))
	}
	rc, ok := raw.(*pluginclient.Client)
	if !ok {
		return failStarted(true, fmt.Errorf("dispensing %q: got %T, not a Switchyard plugin client", shared.PluginSetKey, raw))
	}
	p.rc = rc
	if gc, ok := rpc.(*plugin.GRPCClient); ok {
		p.conn = gc.Conn
	}

	dctx, cancel := context.WithTimeout(ctx, startTimeout)
	stopAfter := context.AfterFunc(p.ctx, cancel)
	desc, err := rc.Describe(dctx)
	stopAfter()
	cancel()
	if err != nil {
		return failStarted(false, err) // err says "plugin describe"
	}
	if desc == nil {
		return failStarted(true, errors.New("describe: empty answer"))
	}
	if pickVersion(desc.APIVersions) == 0 {
		return failStarted(true, fmt.Errorf("unsupported API version: the plugin speaks %v, this router %v",
			desc.APIVersions, supportedAPIVersions))
	}
	p.version = desc.PluginVersion
	p.expectedP99 = desc.ExpectedDecideP99
	p.log.Debug("plugin started", "pid", p.pid, "version", desc.PluginVersion, "types", len(desc.Types))
	return p, desc, nil
}

// clientOptions are the options of the client of p, a process of the
// named plugin: its DecideBatch sizes go to
// switchyard_plugin_decide_tasks_per_message, and a lifecycle event stream
// that breaks while p lives gets p restarted (EventsBroken): its listeners
// would otherwise go on without the events they depend on (sessions no
// longer sticking, counts drifting), while a fresh process starts clean
// and the lost events are counted (Stats.EventsDropped).
func (h *Host) clientOptions(name string, p *proc) pluginclient.Options {
	observe, hook := h.met.decideBatch(name), h.testHookDecideBatch
	o := pluginclient.Options{DecideBatch: observe, EventsBroken: func(err error) {
		if p.ctx.Err() != nil || p.hasExited() {
			return // stopping or gone: the exit is the news
		}
		p.log.Warn("the plugin's lifecycle event stream broke: restarting it so that its listeners start again from a clean state", "error", err)
		p.killGroup("lifecycle event stream broke: " + err.Error())
	}}
	if hook != nil {
		o.DecideBatch = func(tasks int) {
			if observe != nil {
				observe(tasks)
			}
			hook(tasks)
		}
	}
	return o
}

// environ is a plugin's whole environment: env, the variables passEnv
// names that the router's environment has (one it lacks stays unset),
// and go-plugin's socket directory. The router's other variables are
// never passed on.
func environ(env map[string]string, passEnv []string, sockDir string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, 0, len(env)+len(passEnv)+1)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	for _, k := range passEnv {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	// The plugin's go-plugin server makes its socket here; go-plugin's
	// own directory for a RunnerFunc is not used (launch removes it).
	return append(out, plugin.EnvUnixSocketDir+"="+sockDir)
}

// pickVersion returns the highest API version both sides speak, or 0.
func pickVersion(theirs []uint32) uint32 {
	var best uint32
	for _, v := range theirs {
		if v > best && slices.Contains(supportedAPIVersions, v) {
			best = v
		}
	}
	return best
}

// handshakeCause turns go-plugin's Start error into a cause that says what
// went wrong, with the last line the plugin wrote to stderr, and whether
// starting again cannot help: every handshake failure but no handshake
// within start_timeout, which a starved machine can cause. Call it after
// stop, so the stderr tail is complete.
func (p *proc) handshakeCause(err error, path, pinned string, startTimeout time.Duration) (cause error, permanent bool) {
	msg := err.Error()
	first, _, _ := strings.Cut(msg, "\n")
	switch {
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		got := "unknown"
		if sum, serr := fileSHA256(path); serr == nil {
			got = sum
		}
		return fmt.Errorf("sha256 mismatch: %s has sha256 %s, the block pins %s; the binary was not run: %w",
			path, got, pinned, err), true
	case errors.Is(err, errRemoteAddr):
		return fmt.Errorf("handshake failed: %w", err), true
	case p.stdoutTooLong.Load():
		return fmt.Errorf("handshake failed: the plugin wrote a line of more than %d bytes on stdout before its handshake line (plugins must not write to stdout)%s",
			bufio.MaxScanTokenSize, p.stderr.suffix()), true
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return fmt.Errorf("no handshake within start_timeout (%v)%s", startTimeout, p.stderr.suffix()), false
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"),
		strings.Contains(msg, "plugin exited before we could connect"):
		if tail := p.stderr.suffix(); tail != "" {
			// Its own words first: a crash at start (a Python
			// SyntaxError, a missing module) says more than a guess.
			return fmt.Errorf("the plugin exited before completing the handshake%s", tail), true
		}
		return fmt.Errorf("the plugin exited before completing the handshake, printing nothing on stderr (wrong handshake cookie, or not a Switchyard plugin?)"), true
	case strings.HasPrefix(msg, "Unrecognized remote plugin message: "):
		line := strings.TrimPrefix(first, "Unrecognized remote plugin message: ")
		if n := strings.Count(line, "|") + 1; n > 1 {
			return fmt.Errorf("handshake failed: the handshake line %q is malformed: it has %d fields, the protocol expects 5 (%s)%s",
				truncate(line), n, handshakeFields, p.stderr.suffix()), true
		}
		return fmt.Errorf("handshake failed: the plugin printed %q on stdout instead of the handshake line (plugins must not write to stdout)%s",
			truncate(line), p.stderr.suffix()), true
	case strings.HasPrefix(msg, "unsupported plugin protocol "):
		return fmt.Errorf("handshake failed: %s: the handshake line has 4 fields or names another protocol; the protocol expects 5 fields (%s), the last one grpc", first, handshakeFields), true
	case strings.Contains(msg, "ncompatible API version"):
		return fmt.Errorf("unsupported API version: %s", first), true
	}
	return fmt.Errorf("%s%s", first, p.stderr.suffix()), true
}

// handshakeFields are the fields of a handshake line (docs/plugin-protocol.md §2).
const handshakeFields = "CORE|APP|NETWORK|ADDRESS|PROTOCOL"

// quoteMax bounds what an error quotes of a plugin's stdout.
const quoteMax = 100

// truncate shortens s to quoteMax bytes, marking the cut with "...".
func truncate(s string) string {
	if len(s) <= quoteMax {
		return s
	}
	return strings.ToValidUTF8(s[:quoteMax], "") + "..."
}

// errRemoteAddr is checkAddr's error: the handshake gave an address the
// router does not connect to.
var errRemoteAddr = errors.New("the handshake address is not a loopback address")

// checkAddr accepts a handshake address the router may connect to: a unix
// socket, or a TCP address on a loopback IP (127.0.0.0/8, ::1). Anything
// else is an error wrapping errRemoteAddr; nothing is dialled then.
func checkAddr(addr net.Addr) error {
	switch a := addr.(type) {
	case *net.UnixAddr:
		return nil
	case *net.TCPAddr:
		if a.IP.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%w: the plugin gave TCP address %s; the router connects only to a unix socket or to 127.0.0.1:PORT (loopback), and did not connect", errRemoteAddr, a)
	}
	return fmt.Errorf("%w: the plugin gave %s address %s; the router connects only to a unix socket or to 127.0.0.1:PORT", errRemoteAddr, addr.Network(), addr)
}

// dial connects to the plugin's accepted handshake address (p.addr); it
// is the gRPC dialer of the plugin's connection.
func (p *proc) dial(ctx context.Context, _ string) (net.Conn, error) {
	addr := p.addr.Load()
	if addr == nil {
		return nil, errors.New("no accepted handshake address to connect to")
	}
	var d net.Dialer
	return d.DialContext(ctx, (*addr).Network(), (*addr).String())
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// watchExitPipe waits for EOF on the exit pipe (every holder closed it),
// or for stop to close it, then marks the process exited, unless the
// process itself is watched (watchPID): a plugin that closed its fd 3 has
// not exited, and the process watch sees the real exit.
func (p *proc) watchExitPipe() {
	var buf [64]byte
	for {
		if _, err := p.exitR.Read(buf[:]); err != nil {
			break
		}
	}
	<-p.started
	if p.pidWatched {
		return
	}
	p.markExited()
}

// markExited marks the process exited and cancels every call in flight.
func (p *proc) markExited() {
	p.exitOnce.Do(func() {
		p.cancel()
		close(p.exited)
	})
}

// killGroup kills the plugin's whole process group at once (SIGKILL),
// recording why; it never blocks. The exit watchers then see the exit.
func (p *proc) killGroup(reason string) {
	p.killReason.CompareAndSwap(nil, &reason)
	if p.pid > 0 {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

// requestCheck asks the health probe for a check at once; it never
// blocks, and requests made before the probe took the last one coalesce.
func (p *proc) requestCheck() {
	select {
	case p.checkNow <- struct{}{}:
	default:
	}
}

// hasExited reports whether the process has exited.
func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// enter admits one call; false once the plugin is closing or gone.
func (p *proc) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing || p.ctx.Err() != nil {
		return false
	}
	p.inflight++
	return true
}

func (p *proc) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	if p.inflight == 0 && p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
}

// beginClose refuses new calls and returns a channel closed once no call
// is in flight.
func (p *proc) beginClose() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closing = true
	ch := make(chan struct{})
	if p.inflight == 0 {
		close(ch)
	} else {
		p.drained = ch
	}
	return ch
}

// closedErr is the error of a call to a plugin that is gone or shutting
// down; it wraps pluginclient.ErrPluginClosed.
func (p *proc) closedErr(cause error) error {
	why := "shutting down"
	switch {
	case p.hasExited():
		why = "process exited"
	case p.ctx.Err() == nil && cause != nil:
		// The process is up and not being stopped: its stream or
		// connection broke, and the cause says why (a protocol
		// violation, an answer the router could not decode...).
		if errors.Is(cause, pluginclient.ErrPluginClosed) {
			return fmt.Errorf("plugin %q: %w", p.name, cause)
		}
		return fmt.Errorf("plugin %q: %w: %w", p.name, pluginclient.ErrPluginClosed, cause)
	}
	if cause != nil && !errors.Is(cause, pluginclient.ErrPluginClosed) {
		return fmt.Errorf("plugin %q: %w: %s (%v)", p.name, pluginclient.ErrPluginClosed, why, cause)
	}
	return fmt.Errorf("plugin %q: %w: %s", p.name, pluginclient.ErrPluginClosed, why)
}

// stop cancels every call, closes the client, has go-plugin end the
// process (gracefully when it exits within stopGrace), kills the
// whole process group, waits for the process to be reaped, and removes the
// socket directory. Each step is bounded: a wedged plugin never blocks
// stop for more than about killWait.
func (p *proc) stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.doStop() })
	return p.stopErr
}

func (p *proc) doStop() error {
	p.cancel()
	start := time.Now()
	deadline := start.Add(killWait)
	run := p.runner.Load()
	if run != nil {
		run.closeStdout() // nothing more is read from it
	}
	var errs []error
	report := StopReport{Plugin: p.name, PID: p.pid, WasRunning: !p.hasExited()}
	if !report.WasRunning && p.pid > 0 {
		// Nothing graceful is left to do: kill what remains of the group
		// (descendants holding its pipes hold up go-plugin's Kill).
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	if p.rc != nil {
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			if err := p.rc.Close(); err != nil && !errors.Is(err, pluginclient.ErrPluginClosed) {
				p.log.Debug("closing the plugin client", "error", err)
			}
		}()
		waitUntil(closed, time.Now().Add(gracefulKill))
	}
	// go-plugin's Kill asks the plugin to stop, then force-kills the
	// process and reaps it; it blocks while a wedged plugin does not
	// answer, so it runs aside.
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		p.client.Kill()
	}()
	graceEnd := time.Now().Add(p.stopGrace)
	if waitUntil(killed, graceEnd) && report.WasRunning {
		// go-plugin's Kill returned: the process exited on its own (or
		// go-plugin gave up on it and killed it, after 2 s); the exit pipe
		// reports it a moment later.
		report.Exited = waitUntil(p.exited, graceEnd)
		report.After = time.Since(start)
	}
	if p.pid > 0 {
		if err := syscall.Kill(-p.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("killing process group %d: %w", p.pid, err))
		}
	}
	if !waitUntil(killed, deadline) {
		errs = append(errs, fmt.Errorf("go-plugin Kill did not return within %v", killWait))
	} else if st := p.cmd.ProcessState; st != nil {
		// Kill returned once go-plugin's wait for the process ended.
		report.Status = st.String()
	}
	if r := p.killReason.Load(); r != nil {
		report.KillReason = *r
	}
	if !waitUntil(p.exited, deadline) {
		errs = append(errs, fmt.Errorf("process %d did not exit within %v", p.pid, killWait))
	}
	if p.pid > 0 {
		for groupAlive(p.pid) {
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("process group %d still has members after %v", p.pid, killWait))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := os.RemoveAll(p.sockDir); err != nil {
		errs = append(errs, fmt.Errorf("removing the socket directory: %w", err))
	}
	if p.sockLock != nil {
		_ = p.sockLock.Close() // after the removal: a sweep never sees it unlocked
	}
	_ = p.exitR.Close() // ends watchExitPipe, should a stray descendant hold the pipe
	if run != nil && !waitUntil(run.relayed, deadline) {
		errs = append(errs, fmt.Errorf("the relay of the plugin's stdout did not end within %v", killWait))
	}
	p.bg.Wait()
	if p.onStopped != nil && p.pid > 0 {
		if !report.Exited {
			report.After = p.stopGrace
		}
		p.onStopped(report)
	}
	return errors.Join(errs...)
}

// waitUntil waits for ch to close until deadline; false on timeout.
func waitUntil(ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// tail keeps the last few meaningful lines a plugin wrote to stderr, for
// start errors. hclog JSON lines below warn are skipped; the others are
// shortened to their level, message and error field. Each line is read up
// to tailRawMax bytes, so a JSON line whose error is long still parses,
// and kept as at most tailLineMax bytes.
type tail struct {
	mu    sync.Mutex
	split lineSplitter // tailRawMax
	lines []string
}

// newTail returns an empty tail.
func newTail() *tail { return &tail{split: lineSplitter{max: tailRawMax}} }

const (
	tailLines   = 3
	tailLineMax = 200
	tailRawMax  = 4 << 10
)

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.split.write(b, t.flush)
	return len(b), nil
}

// flush keeps a line (its first tailRawMax bytes) if it is meaningful.
func (t *tail) flush(b []byte, _ int) {
	line := strings.TrimSpace(string(b))
	if strings.HasPrefix(line, "{") {
		var entry struct {
			Level   string `json:"@level"`
			Message string `json:"@message"`
			Error   string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil {
			switch entry.Level {
			case "trace", "debug", "info":
				return
			}
			line = entry.Level + ": " + entry.Message
			if entry.Error != "" {
				line += ": " + entry.Error
			}
		}
	}
	if line == "" {
		return
	}
	if len(line) > tailLineMax {
		line = strings.ToValidUTF8(line[:tailLineMax], "") + "..."
	}
	if len(t.lines) == tailLines {
		t.lines = t.lines[1:]
	}
	t.lines = append(t.lines, line)
}

// suffix renders the last stderr lines as `; stderr: "..."`, or "".
func (t *tail) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.split.write([]byte{'\n'}, t.flush) // the line written so far
	if len(t.lines) == 0 {
		return ""
	}
	return fmt.Sprintf("; stderr: %q", strings.Join(t.lines, " / "))
}
