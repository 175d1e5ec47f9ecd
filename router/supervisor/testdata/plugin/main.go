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
//	stderr     write to stderr, before serving, the plain line "plain line
//	           from the plugin" and two hclog JSON lines, "json warn line"
//	           at warn and "json debug line" at debug
//
// SY_STARTS names a file it appends a line ("pid unixnano") to at every
// start, and SY_MARKER a file it creates, so tests can tell whether (and
// how often, and when) it ran. SY_ENV_OUT names a file it writes its
// environment to, one NAME=VALUE a line.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
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
	case "builtin":
		shared.Serve(shared.ServeOpts{Version: "test", Types: []shared.TypeInfo{
			builtin.KVCostType(), builtin.MinCostType(), builtin.BusyType(),
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

func serve() {
	shared.Serve(shared.ServeOpts{Version: "test", Types: types()})
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
	}
	return nil
}

type lowest struct{}

func (lowest) Inputs() shared.Inputs { return 0 }

func (lowest) Pick(_ context.Context, _ *shared.Request, c *shared.Candidates) (int, error) {
	best := 0
	for i, v := range c.Costs {
		if v < c.Costs[best] {
			best = i
		}
	}
	return best, nil
}
