package shared

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// APIVersion is the plugin API version this SDK speaks: switchyard.plugin.v1.
// go-plugin negotiates it as the protocol version (VersionedPlugins).
const APIVersion = 1

// MaxMessageBytes is the gRPC send and receive limit, set explicitly on both
// sides of the plugin connection (gRPC's default receive limit is 4 MiB). A
// Decide result over it is answered with an error for its task instead.
const MaxMessageBytes = 64 << 20

// PluginSetKey is the name the plugin is dispensed under from the plugin
// set (plugin.ClientProtocol.Dispense).
const PluginSetKey = "switchyard"

// LogLevelEnv names the environment variable that sets a plugin's log
// level (trace, debug, info, warn, error); the default is info.
const LogLevelEnv = "SWITCHYARD_PLUGIN_LOG_LEVEL"

// Handshake returns the handshake every Switchyard plugin and the router
// share. The cookie only tells a plugin binary it was started by the router
// (and not from a shell); it is not a security measure.
//
// Protocol versions (go-plugin negotiates one through VersionedPlugins):
//   - 1: switchyard.plugin.v1 over gRPC: Describe, Configure, Decide
//     (bidirectional, batched tasks), Classify (request classifiers) and
//     Events (bidirectional: batched lifecycle events, acknowledged).
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  APIVersion,
		MagicCookieKey:   "SWITCHYARD_PLUGIN",
		MagicCookieValue: "02131c040c44fb6342fb990f8fd29af6a7da02727dd67a7a8ec8c87382e54d8a",
	}
}

// GRPCPlugin is the go-plugin plugin.GRPCPlugin that serves Types: what
// Serve serves under PluginSetKey for APIVersion. A plugin binary that
// builds its own plugin.ServeConfig (to add a gRPC service, or to test a
// handshake) puts it in its VersionedPlugins; most call Serve instead.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin

	// Version is the plugin's version, returned by Describe.
	Version string
	// Types are the component types served.
	Types []TypeInfo
	// Logger receives the server's logs; nil discards them.
	Logger hclog.Logger
	// ExpectedDecideP99 is ServeOpts.ExpectedDecideP99.
	ExpectedDecideP99 time.Duration
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the switchyard.plugin.v1 service for p.Types.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	srv := newServer(p.Version, p.Types, p.Logger)
	srv.expectedP99 = p.ExpectedDecideP99
	pluginv1.RegisterPluginServer(s, srv)
	return nil
}

// GRPCClient returns the generated switchyard.plugin.v1 client over conn
// (a pluginv1.PluginClient, for tests that speak the protocol directly).
// The router dispenses its own client instead; the SDK has none.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return pluginv1.NewPluginClient(conn), nil
}

// ServeOpts are what a plugin binary passes to Serve.
type ServeOpts struct {
	// Version is the plugin's own version, returned by Describe.
	Version string
	// Types are the component types the plugin provides; each must have a
	// unique Name, a Kind (filter, scorer, picker or classifier), and New
	// set.
	Types []TypeInfo
	// Logger is optional. The default logs JSON to stderr (which go-plugin
	// forwards to the router's log) at the level SWITCHYARD_PLUGIN_LOG_LEVEL
	// names, info by default. Never write to stdout: go-plugin owns it.
	Logger hclog.Logger
	// ExpectedDecideP99, when positive, is the p99 time the plugin expects
	// to take over one Decide task under load (DescribeResponse's
	// expected_decide_p99_nanos; rounded up to a whole nanosecond, 0 for
	// none). The router logs a warning at the plugin's start when the
	// plugin block's call_timeout (default 20ms) is below it, and
	// `router plugins check` warns too (docs/plugin-protocol.md,
	// "Deadlines by language").
	ExpectedDecideP99 time.Duration
}

// Serve serves opts.Types to the router and blocks until the router ends
// the plugin. It exits the process with status 1 when opts are invalid (no
// type, a duplicate name, a nil New).
//
// When the router dies, Serve cleans up after it, so nothing of the plugin
// outlives the router, even one killed with SIGKILL: the router starts each
// plugin as the leader of its own process group, with SIGTERM as its
// parent-death signal (Linux), and Serve also watches its parent pid (every
// 250ms, on every platform). On SIGTERM or a changed parent pid, Serve
// removes its socket directory (the PLUGIN_UNIX_SOCKET_DIR the router made
// for it, only if it looks like one: a directory named "sy-*" holding only
// sockets) and then, when it leads its process group, SIGKILLs the whole
// group, itself included, so any process the plugin started goes with it;
// otherwise it exits with status 1. A normal router shutdown does not go
// this way: the router asks go-plugin to stop the plugin and then kills
// the group and removes the directory itself.
func Serve(opts ServeOpts) {
	log := opts.Logger
	if log == nil {
		log = defaultLogger()
	}
	if err := validateTypes(opts.Types); err != nil {
		log.Error("invalid plugin types", "error", err)
		os.Exit(1)
	}
	sockDir := os.Getenv(plugin.EnvUnixSocketDir)
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		<-terms
		abandon(log, sockDir, "SIGTERM (the router died, or an operator asked)")
	}()
	go watchParent(os.Getppid(), 250*time.Millisecond, func(ppid, now int) {
		abandon(log, sockDir, fmt.Sprintf("the parent process %d exited (new parent %d)", ppid, now))
	})
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{
			APIVersion: {PluginSetKey: &GRPCPlugin{Version: opts.Version, Types: opts.Types, Logger: log, ExpectedDecideP99: opts.ExpectedDecideP99}},
		},
		GRPCServer: func(o []grpc.ServerOption) *grpc.Server {
			o = append(o, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
			return plugin.DefaultGRPCServer(o)
		},
		Logger: log,
	})
}

// defaultLogger logs JSON to stderr at the level LogLevelEnv names.
func defaultLogger() hclog.Logger {
	level := hclog.LevelFromString(os.Getenv(LogLevelEnv))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "switchyard-plugin",
		Level:      level,
		Output:     os.Stderr,
		JSONFormat: true,
	})
}

// watchParent calls exit with the old and new parent pid when the parent
// pid is no longer ppid (the router died and the process was reparented),
// checking every interval.
func watchParent(ppid int, interval time.Duration, exit func(ppid, now int)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if now := os.Getppid(); now != ppid {
			exit(ppid, now)
			return
		}
	}
}

// abandon ends the plugin without its router: it removes the socket
// directory, then kills the plugin's process group (itself included) when
// it leads it, or exits with status 1. It does not return.
//
// SIGPIPE is ignored first: the router's end of stderr is likely closed
// already, and a log line written to it would otherwise kill the process
// (Go's rule for fds 1 and 2) before its group.
func abandon(log hclog.Logger, sockDir, why string) {
	signal.Ignore(syscall.SIGPIPE)
	err := removeSocketDir(sockDir)
	log.Error("stopping without the router; killing the process group", "reason", why)
	if err != nil {
		log.Warn("socket directory left behind", "dir", sockDir, "error", err)
	}
	killOwnGroup()
	os.Exit(1)
}

// removeSocketDir removes dir when it looks like a socket directory the
// router made: a directory (not a link) whose name starts with "sy-" and
// that holds nothing but sockets. Anything else is left alone; "" is
// nothing to do.
func removeSocketDir(dir string) error {
	if dir == "" || !strings.HasPrefix(filepath.Base(dir), "sy-") {
		return nil
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if !fi.IsDir() {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			return fmt.Errorf("not removed: %s is not a socket", e.Name())
		}
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// validateTypes checks the types a plugin serves.
func validateTypes(types []TypeInfo) error {
	if len(types) == 0 {
		return fmt.Errorf("no component types to serve")
	}
	seen := make(map[string]bool, len(types))
	var problems []string
	for i, t := range types {
		switch {
		case t.Name == "":
			problems = append(problems, fmt.Sprintf("type #%d has no name", i))
		case seen[t.Name]:
			problems = append(problems, fmt.Sprintf("type %q is defined twice", t.Name))
		}
		seen[t.Name] = true
		if t.New == nil {
			problems = append(problems, fmt.Sprintf("type %q has a nil New", t.Name))
		}
		switch t.Kind {
		case KindFilter, KindScorer, KindPicker, KindClassifier:
		default:
			problems = append(problems, fmt.Sprintf("type %q has invalid kind %d", t.Name, t.Kind))
		}
		for _, p := range t.Params {
			if p.Default == nil {
				continue
			}
			v, err := pluginwire.ValueToProto(p.Default)
			if err == nil {
				_, err = pluginwire.ValueFromProto(v, paramTypeToProto(p.Type))
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("type %q parameter %q default: %v", t.Name, p.Name, err))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
