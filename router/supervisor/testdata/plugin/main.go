// Command plugin is the supervisor tests' plugin binary. SY_TEST_MODE in
// its environment selects a behaviour:
//
//	"" (good)  serve a filter, a scorer and a picker
//	cookie     serve with the wrong handshake cookie
//	version    serve API version 99 only
//	stdout     print a line on stdout, then serve
//	hang       never complete the handshake
//	child      start a child (in hang mode) that writes its pid to
//	           SY_CHILD, then serve
//	builtin    serve the router's own built-in kv-cost, min-cost and busy
//	           types, unchanged
//	crash      the first start (SY_STARTS empty) serves; every later one
//	           exits (status 3) when asked to configure an instance, while
//	           the file SY_CRASH names exists (always when SY_CRASH is
//	           unset)
//	freeze     serve, but after SY_FREEZE_AFTER scorer calls (0 when
//	           unset) every scorer call blocks forever, ignoring its
//	           deadline; pickers and the health service still answer
//	slow       every t-active scorer call sleeps SY_SLOW (a Go duration),
//	           ignoring its deadline, then scores: a plugin that answers
//	           every call, late
//	grandchild-stderr
//	           start a grandchild (in hang mode, in the plugin's process
//	           group) holding the plugin's stderr, write its pid to
//	           SY_CHILD, then serve
//	big        the t-active scorer fails with an error message over
//	           shared.MaxMessageBytes (the SDK answers it with a short
//	           "exceeds the limit" error instead)
//	fail       the t-active scorer's calls follow SY_FAIL, a cycle of
//	           comma-separated outcomes: call n (from 1) takes entry
//	           (n-1) mod len. "ok" scores, "error" returns the error
//	           "injected error on call n", "panic" panics with
//	           "injected panic on call n"
//	badschema  serve the good types, but t-max-active has no doc, a second
//	           parameter "max" and a parameter "bad name" (for
//	           `router plugins check`)
//	stdout-after
//	           serve the good types, but configuring t-max-active prints
//	           "configured t-max-active" on stdout
//	linger     serve, and keep running for an hour once serving ends
//	           (asked to shut down)
//	decide-dup, decide-extra, decide-drop
//	           serve the good types, but on the Decide stream the result
//	           of task 2^62+1 (the first task of `router plugins check`'s
//	           batch check) is sent twice (dup), is followed by a result
//	           for task 7, never sent (extra), or is never sent (drop)
//	badbound   serve the good types, but t-max-active refuses a negative
//	           max with an error naming no parameter
//	boundcrash serve the good types, but configuring t-max-active with the
//	           smallest int64 as max exits the process (status 3)
//	orphan     serve the good types through go-plugin directly, ignoring
//	           SIGTERM: nothing notices the parent's death
//	leavedir   serve the good types through go-plugin directly, exiting
//	           on SIGTERM (the parent-death signal) without removing the
//	           socket directory
//	nowait     serve the good types and t-classify, a classifier wanting
//	           events, whose Classify calls are answered at once, without
//	           waiting for events_through
//	fields     print the handshake line "1|1|unix" (3 fields), then hang
//	fields4    print the handshake line "1|1|unix|/nonexistent/sock" (no
//	           protocol field), then hang
//	hugeline   print a line of 100000 bytes on stdout, then hang
//	tcp-remote print a handshake line with the TCP address 192.0.2.1:53
//	           (TEST-NET-1, not loopback), then hang
//	closefd3   close file descriptor 3 (the router's exit pipe), then
//	           serve
//	names      serve the good types renamed, in order, to the
//	           comma-separated names of SY_TYPE_NAMES
//	no-types, dup-type, extra-inputs, filtered-kept
//	           serve the good types, but Describe declares no type
//	           (no-types) or t-lowest twice (dup-type); Configure answers
//	           every input (extra-inputs); the Decide result of task
//	           2^62+1 keeps row 0 and names its instance in filtered_by
//	           (filtered-kept)
//	no-reflection
//	           serve the good types, refusing gRPC server reflection
//	           (Unimplemented), as a plugin not built on go-plugin does
//	undeclared serve the good types, but t-active's scorer reads the LOAD
//	           column (Candidates.Load), which it does not declare
//	stderr     write to stderr, before serving, the plain line "plain line
//	           from the plugin" and two hclog JSON lines, "json warn line"
//	           at warn and "json debug line" at debug
//	invalid    serve the good types, but break every Decide result without
//	           an error as SY_INVALID says: "costs" drops the last cost,
//	           "nan" makes the first cost NaN, "picked" picks row 2^20,
//	           "kept" adds row 2^20 to the kept rows, "filtered-by" sets
//	           filtered_by to an escape sequence and 1 MiB of "x" (no kept
//	           rows), "error" answers the error "\x1b[31mred" followed by
//	           SY_INVALID_BYTES (default 12 MiB) bytes of "e";
//	           "kept-descending" and "kept-all" change only a scorer's
//	           result (costs, no kept rows): kept rows n, n-1, ..., 1 for
//	           its n rows (descending, the first out of range), or every
//	           row, 0 to n-1 (the full ascending list the router accepts)
//	stderr-flood
//	           write SY_STDERR_MB MiB (default 64) of 1 KiB lines to stderr,
//	           then serve
//	stdout-flood
//	           serve the good types, but each t-lowest Pick first writes a
//	           4 KiB line to file descriptor 1 (the raw stdout, not the
//	           SDK's), the first Pick a line of 100 KiB before it
//
// SY_EXPECTED_P99 (a Go duration), in the modes that serve the good types
// with serve(), is the Decide p99 Describe declares
// (ServeOpts.ExpectedDecideP99).
//
// SY_STARTS names a file it appends a line ("pid unixnano") to at every
// start, and SY_MARKER a file it creates, so tests can tell whether (and
// how often, and when) it ran. SY_ENV_OUT names a file it writes its
// environment to, one NAME=VALUE a line, and SY_ARGS_OUT one it writes its
// arguments to, one a line.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

func main() {
	earlier := 0
	if f := os.Getenv("SY_STARTS"); f != "" {
		if b, err := os.ReadFile(f); err == nil {
			earlier = strings.Count(string(b), "\n")
		}
		out, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			_, _ = fmt.Fprintln(out, os.Getpid(), time.Now().UnixNano())
			_ = out.Close()
		}
	}
	if f := os.Getenv("SY_MARKER"); f != "" {
		_ = os.WriteFile(f, []byte("ran\n"), 0o600)
	}
	if f := os.Getenv("SY_ENV_OUT"); f != "" {
		_ = os.WriteFile(f, []byte(strings.Join(os.Environ(), "\n")+"\n"), 0o600)
	}
	if f := os.Getenv("SY_ARGS_OUT"); f != "" {
		_ = os.WriteFile(f, []byte(strings.Join(os.Args[1:], "\n")+"\n"), 0o600)
	}
	switch os.Getenv("SY_TEST_MODE") {
	case "cookie":
		hs := shared.Handshake()
		hs.MagicCookieValue = "not-the-switchyard-cookie"
		serveRaw(hs, 1)
	case "version":
		hs := shared.Handshake()
		hs.ProtocolVersion = 99
		serveRaw(hs, 99)
	case "stdout":
		fmt.Println("hello from the plugin")
		serve()
	case "hang":
		time.Sleep(time.Hour)
	case "fields":
		fmt.Println("1|1|unix")
		time.Sleep(time.Hour)
	case "fields4":
		fmt.Println("1|1|unix|/nonexistent/sock")
		time.Sleep(time.Hour)
	case "hugeline":
		fmt.Println(strings.Repeat("x", 100000))
		time.Sleep(time.Hour)
	case "tcp-remote":
		fmt.Println("1|1|tcp|192.0.2.1:53|grpc")
		time.Sleep(time.Hour)
	case "closefd3":
		if err := syscall.Close(3); err != nil {
			panic(err)
		}
		serve()
	case "mute-socket":
		// Handshakes on a socket that accepts connections and never
		// speaks gRPC (nor anything else).
		sock := filepath.Join(os.Getenv("PLUGIN_UNIX_SOCKET_DIR"), "mute")
		l, err := net.Listen("unix", sock)
		if err != nil {
			panic(err)
		}
		fmt.Printf("1|1|unix|%s|grpc\n", sock)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	case "child":
		startChild(nil)
		serve()
	case "crash":
		if f := os.Getenv("SY_CRASH"); earlier == 0 || f != "" && !exists(f) {
			serve()
			return
		}
		ts := types()
		for i := range ts {
			ts[i].New = func(shared.InstanceInfo, shared.Params) (shared.Component, error) {
				os.Exit(3)
				return nil, nil
			}
		}
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "freeze":
		freeze = true
		freezeAfter, _ = strconv.ParseInt(os.Getenv("SY_FREEZE_AFTER"), 10, 64)
		serve()
	case "slow":
		var err error
		if slow, err = time.ParseDuration(os.Getenv("SY_SLOW")); err != nil {
			panic(err)
		}
		serve()
	case "stderr":
		fmt.Fprintln(os.Stderr, "plain line from the plugin")
		fmt.Fprintln(os.Stderr, `{"@level":"warn","@message":"json warn line","@timestamp":"2026-01-01T00:00:00.000000Z"}`)
		fmt.Fprintln(os.Stderr, `{"@level":"debug","@message":"json debug line","@timestamp":"2026-01-01T00:00:00.000000Z"}`)
		serve()
	case "grandchild-stderr":
		startChild(os.Stderr)
		serve()
	case "big":
		big = true
		serve()
	case "undeclared":
		undeclared = true
		serve()
	case "fail":
		failCycle = strings.Split(os.Getenv("SY_FAIL"), ",")
		serve()
	case "badschema":
		ts := types()
		ts[0].Doc = ""
		ts[0].Params = append(ts[0].Params,
			shared.ParamSpec{Name: "max", Type: shared.Int, Doc: "the same name again"},
			shared.ParamSpec{Name: "bad name", Type: shared.Bool, Doc: "not an identifier"})
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "stdout-after":
		ts := types()
		newMax := ts[0].New
		ts[0].New = func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			fmt.Println("configured t-max-active")
			return newMax(info, p)
		}
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "linger":
		serve()
		time.Sleep(time.Hour)
	case "names":
		ts := types()
		for i, name := range strings.Split(os.Getenv("SY_TYPE_NAMES"), ",") {
			ts[i].Name = name
		}
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "no-types", "dup-type", "extra-inputs":
		serveIntercepted(grpc.UnaryInterceptor(mangleUnary(os.Getenv("SY_TEST_MODE"))))
	case "no-reflection":
		serveIntercepted(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if strings.HasPrefix(info.FullMethod, "/grpc.reflection.") {
				return status.Error(codes.Unimplemented, "no reflection")
			}
			return h(srv, ss)
		}))
	case "filtered-kept":
		serveIntercepted(grpc.StreamInterceptor(mangleDecide("filtered-kept")))
	case "invalid":
		serveIntercepted(grpc.StreamInterceptor(mangleDecide("invalid")))
	case "stderr-flood":
		mb, err := strconv.Atoi(os.Getenv("SY_STDERR_MB"))
		if err != nil {
			mb = 64
		}
		line := []byte(strings.Repeat("f", 1023) + "\n")
		for written := 0; written < mb<<20; written += len(line) {
			if _, err := os.Stderr.Write(line); err != nil {
				panic(err)
			}
		}
		serve()
	case "stdout-flood":
		stdoutFlood = true
		serve()
	case "decide-dup", "decide-extra", "decide-drop":
		serveIntercepted(grpc.StreamInterceptor(mangleDecide(os.Getenv("SY_TEST_MODE"))))
	case "badbound":
		ts := types()
		newMax := ts[0].New
		ts[0].New = func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			if p.Int("max", 100) < 0 {
				return nil, errors.New("negative")
			}
			return newMax(info, p)
		}
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "boundcrash":
		ts := types()
		newMax := ts[0].New
		ts[0].New = func(info shared.InstanceInfo, p shared.Params) (shared.Component, error) {
			if p.Int("max", 100) == math.MinInt64 {
				os.Exit(3)
			}
			return newMax(info, p)
		}
		shared.Serve(shared.ServeOpts{Version: "test", Types: ts})
	case "orphan", "leavedir":
		serveIntercepted()
	case "nowait":
		serveIntercepted(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if _, ok := req.(*pluginv1.ClassifyRequest); ok {
				return &pluginv1.ClassifyResponse{}, nil
			}
			return h(ctx, req)
		}))
	case "builtin":
		shared.Serve(shared.ServeOpts{Version: "test", Types: []shared.TypeInfo{
			builtin.KVAffinityType(), builtin.KVCostType(), builtin.MinCostType(), builtin.BusyType(),
		}})
	default:
		serve()
	}
}

func exists(file string) bool {
	_, err := os.Stat(file)
	return err == nil
}

// serveRaw serves the SDK's plugin through go-plugin directly, with hs and
// the plugin set under version v.
func serveRaw(hs plugin.HandshakeConfig, v int) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  hs,
		VersionedPlugins: map[int]plugin.PluginSet{v: {shared.PluginSetKey: &shared.GRPCPlugin{Types: types()}}},
		GRPCServer:       func(o []grpc.ServerOption) *grpc.Server { return plugin.DefaultGRPCServer(o) },
	})
}

// startChild starts this binary again in hang mode, in the plugin's
// process group, with stderr as its stderr, and records its pid in
// SY_CHILD.
func startChild(stderr *os.File) {
	self, err := os.Executable()
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{"SY_TEST_MODE=hang"}
	if stderr != nil {
		cmd.Stderr = stderr
	}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	if err := os.WriteFile(os.Getenv("SY_CHILD"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		panic(err)
	}
}

// serveIntercepted serves the good types (and t-classify) through
// go-plugin directly, without Serve's watch of the parent, with extra gRPC
// server options.
//
// Unless in orphan mode (which ignores SIGTERM) or leavedir mode (which
// exits on it, leaving the socket directory), SIGTERM removes the socket
// directory and exits, as Serve does.
func serveIntercepted(extra ...grpc.ServerOption) {
	switch os.Getenv("SY_TEST_MODE") {
	case "orphan":
		signal.Ignore(syscall.SIGTERM)
	case "leavedir":
		terms := make(chan os.Signal, 1)
		signal.Notify(terms, syscall.SIGTERM)
		go func() {
			<-terms
			os.Exit(1)
		}()
	default:
		terms := make(chan os.Signal, 1)
		signal.Notify(terms, syscall.SIGTERM)
		go func() {
			<-terms
			_ = os.RemoveAll(os.Getenv(plugin.EnvUnixSocketDir))
			os.Exit(1)
		}()
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: shared.Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{shared.APIVersion: {
			shared.PluginSetKey: &shared.GRPCPlugin{Types: append(types(), classifierType())}}},
		GRPCServer: func(o []grpc.ServerOption) *grpc.Server { return plugin.DefaultGRPCServer(append(o, extra...)) },
	})
}

// mangleDecide breaks the Decide stream's answer to task 2^62+1 as mode
// says.
func mangleDecide(mode string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != pluginv1.Plugin_Decide_FullMethodName {
			return h(srv, ss)
		}
		return h(srv, &mangled{ServerStream: ss, mode: mode})
	}
}

// mangleUnary breaks the Describe or Configure answers as mode says.
func mangleUnary(mode string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		switch r := resp.(type) {
		case *pluginv1.DescribeResponse:
			switch mode {
			case "no-types":
				r.Types = nil
			case "dup-type":
				r.Types = append(r.Types, r.Types[len(r.Types)-1])
			}
		case *pluginv1.ConfigureResponse:
			if mode == "extra-inputs" && len(r.GetDiagnostics()) == 0 {
				r.Inputs = uint32(shared.PluginInputs)
			}
		}
		return resp, err
	}
}

type mangled struct {
	grpc.ServerStream
	mode string
}

func (m *mangled) SendMsg(msg any) error {
	rs, ok := msg.(*pluginv1.DecideResults)
	if !ok {
		return m.ServerStream.SendMsg(msg)
	}
	if m.mode == "invalid" {
		for _, r := range rs.GetResults() {
			if r.GetError() == "" {
				breakResult(r, os.Getenv("SY_INVALID"))
			}
		}
		return m.ServerStream.SendMsg(rs)
	}
	out := &pluginv1.DecideResults{}
	for _, r := range rs.GetResults() {
		if r.GetTaskId() != 1<<62+1 {
			out.Results = append(out.Results, r)
			continue
		}
		switch m.mode {
		case "decide-dup":
			out.Results = append(out.Results, r, r)
		case "decide-extra":
			out.Results = append(out.Results, r, &pluginv1.DecideResult{TaskId: 7, Picked: -1})
		case "filtered-kept":
			r.Kept, r.FilteredBy = []uint32{0}, "check/t-max-active"
			out.Results = append(out.Results, r)
		}
	}
	if len(out.Results) == 0 {
		return nil
	}
	return m.ServerStream.SendMsg(out)
}

// breakResult breaks a good Decide result as how says (invalid mode).
func breakResult(r *pluginv1.DecideResult, how string) {
	switch how {
	case "costs":
		if len(r.Costs) > 0 {
			r.Costs = r.Costs[:len(r.Costs)-1]
		}
	case "nan":
		if len(r.Costs) > 0 {
			r.Costs[0] = math.NaN()
		}
	case "picked":
		r.Picked = 1 << 20
	case "kept":
		r.Kept = append(r.Kept, 1<<20)
	case "kept-descending", "kept-all":
		if len(r.Costs) == 0 || len(r.Kept) > 0 {
			return
		}
		n := len(r.Costs)
		for i := range n {
			if how == "kept-all" {
				r.Kept = append(r.Kept, uint32(i))
			} else {
				r.Kept = append(r.Kept, uint32(n-i))
			}
		}
	case "filtered-by":
		r.FilteredBy, r.Kept, r.Costs, r.Picked = "\x1b[2J"+strings.Repeat("x", 1<<20), nil, nil, -1
	case "error":
		n, err := strconv.Atoi(os.Getenv("SY_INVALID_BYTES"))
		if err != nil {
			n = 12 << 20
		}
		*r = pluginv1.DecideResult{TaskId: r.GetTaskId(), Picked: -1, Error: "\x1b[31mred" + strings.Repeat("e", n)}
	}
}

// classifierType is t-classify: a classifier wanting events that gives
// every request priority 1.
func classifierType() shared.TypeInfo {
	return shared.TypeInfo{Name: "t-classify", Kind: shared.KindClassifier, Events: true, Doc: "priority 1 for all",
		New: func(shared.InstanceInfo, shared.Params) (shared.Component, error) { return classifier{}, nil }}
}

type classifier struct{}

func (classifier) Inputs() shared.Inputs { return 0 }
func (classifier) NewClassifier(shared.PartitionContext) (shared.Classifier, error) {
	return classifier{}, nil
}
func (classifier) Classify(context.Context, *shared.Request) (shared.Classification, error) {
	return shared.Classification{Priority: 1}, nil
}
func (classifier) OnEvents([]shared.Event) {}

func serve() {
	// SY_EXPECTED_P99, a Go duration, is the Decide p99 Describe declares.
	p99, _ := time.ParseDuration(os.Getenv("SY_EXPECTED_P99"))
	shared.Serve(shared.ServeOpts{Version: "test", Types: types(), ExpectedDecideP99: p99})
}

// envKeys lists the plugin's environment variables, except go-plugin's.
func envKeys() string {
	var keys []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PLUGIN_") || k == shared.Handshake().MagicCookieKey {
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

func types() []shared.TypeInfo {
	return []shared.TypeInfo{
		{
			Name:   "t-max-active",
			Kind:   shared.KindFilter,
			Inputs: shared.InputActiveRequests,
			Params: []shared.ParamSpec{{Name: "max", Type: shared.Int, Default: int64(100), Doc: "most active requests kept"}},
			Doc:    "keeps workers with at most max active requests",
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				return &maxActive{max: p.Int("max", 100)}, nil
			},
		},
		{
			Name:   "t-active",
			Kind:   shared.KindScorer,
			Inputs: shared.InputActiveRequests,
			Params: []shared.ParamSpec{
				{Name: "factor", Type: shared.Number, Default: 1.0, Doc: "cost per active request"},
				{Name: "delay", Type: shared.Duration, Doc: "sleep before scoring"},
			},
			Doc: "env:" + envKeys(),
			New: func(_ shared.InstanceInfo, p shared.Params) (shared.Component, error) {
				f := p.Float("factor", 1)
				if err := shared.NonNegative("factor", f); err != nil {
					return nil, err
				}
				return &active{factor: f, delay: p.Duration("delay", 0)}, nil
			},
		},
		{
			Name: "t-lowest",
			Kind: shared.KindPicker,
			Doc:  "picks the lowest cost",
			New: func(info shared.InstanceInfo, _ shared.Params) (shared.Component, error) {
				if info.Role == shared.RoleDecode {
					return nil, errors.New("t-lowest does not pick decode workers")
				}
				return lowest{}, nil
			},
		},
	}
}

type maxActive struct{ max int64 }

func (f *maxActive) Inputs() shared.Inputs { return shared.InputActiveRequests }

func (f *maxActive) Filter(_ context.Context, _ *shared.Request, c *shared.Candidates, keep []bool) error {
	for i, a := range c.ActiveRequests {
		keep[i] = a <= f.max
	}
	return nil
}

var (
	// freeze: scorer calls after freezeAfter block forever.
	freeze      bool
	freezeAfter int64
	scored      atomic.Int64
	// slow: every scorer call sleeps that long first (slow mode).
	slow time.Duration
	// big: the scorer fails with an error over the message-size limit.
	big bool
	// failCycle: the outcomes of the scorer's calls, in turn (fail mode).
	failCycle []string
	failCalls atomic.Int64
	// undeclared: the scorer reads Candidates.Load, not declared.
	undeclared bool
	// stdoutFlood: the picker writes to file descriptor 1 (stdout-flood).
	stdoutFlood bool
	picks       atomic.Int64
)

type active struct {
	factor float64
	delay  time.Duration
}

func (s *active) Inputs() shared.Inputs { return shared.InputActiveRequests }

func (s *active) Score(ctx context.Context, _ *shared.Request, c *shared.Candidates, costs []float64) error {
	if freeze && scored.Add(1) > freezeAfter {
		select {} // a handler that never returns
	}
	time.Sleep(slow) // ignoring ctx: the answer comes late
	if big {
		return errors.New(strings.Repeat("x", shared.MaxMessageBytes+1<<20))
	}
	if len(failCycle) > 0 {
		n := failCalls.Add(1)
		switch failCycle[(n-1)%int64(len(failCycle))] {
		case "error":
			return fmt.Errorf("injected error on call %d", n)
		case "panic":
			panic(fmt.Sprintf("injected panic on call %d", n))
		}
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i, a := range c.ActiveRequests {
		costs[i] = float64(a) * s.factor
		if undeclared {
			costs[i] += float64(c.Load[i].Waiting)
		}
	}
	return nil
}

type lowest struct{}

func (lowest) Inputs() shared.Inputs { return 0 }

func (lowest) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	if stdoutFlood {
		if picks.Add(1) == 1 {
			writeFD1(strings.Repeat("L", 100<<10) + "\n")
		}
		writeFD1(strings.Repeat("s", 4<<10-1) + "\n")
	}
	best := 0
	for i, v := range c.Costs {
		if v < c.Costs[best] {
			best = i
		}
	}
	return best, nil
}

// writeFD1 writes s to file descriptor 1, the stdout the plugin was
// started with (the SDK points os.Stdout elsewhere), blocking while the
// pipe is full.
func writeFD1(s string) {
	for b := []byte(s); len(b) > 0; {
		n, err := syscall.Write(1, b)
		if err != nil && err != syscall.EINTR && err != syscall.EAGAIN {
			panic(err)
		}
		b = b[max(n, 0):]
	}
}
