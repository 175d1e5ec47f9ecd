package shared

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
)

// MaxMessageBytes is the gRPC send and receive limit, set explicitly on both
// sides of the plugin connection (gRPC's default receive limit is 4 MiB).
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
//     (bidirectional, batched tasks), Classify and Events (Unimplemented in
//     this SDK so far).
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  APIVersion,
		MagicCookieKey:   "SWITCHYARD_PLUGIN",
		MagicCookieValue: "02131c040c44fb6342fb990f8fd29af6a7da02727dd67a7a8ec8c87382e54d8a",
	}
}

// HostPluginSets returns the VersionedPlugins for the host's
// plugin.ClientConfig: API version 1 dispenses a *RemoteClient under
// PluginSetKey.
func HostPluginSets() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{APIVersion: {PluginSetKey: &GRPCPlugin{}}}
}

// GRPCPlugin is the go-plugin plugin.GRPCPlugin of Switchyard. On the plugin
// side it serves Types; on the host side (zero value, see HostPluginSets)
// GRPCClient returns a *RemoteClient.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin

	// Version is the plugin's version, returned by Describe (plugin side).
	Version string
	// Types are the component types served (plugin side).
	Types []TypeInfo
	// Logger receives the server's logs (plugin side); nil discards them.
	Logger hclog.Logger
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the switchyard.plugin.v1 service for p.Types.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, newServer(p.Version, p.Types, p.Logger))
	return nil
}

// GRPCClient returns a *RemoteClient over conn. ctx is go-plugin's context
// for the plugin process: it is cancelled when the process exits, which
// ends the client's Decide stream.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewRemoteClient(ctx, conn), nil
}

// ServeOpts are what a plugin binary passes to Serve.
type ServeOpts struct {
	// Version is the plugin's own version, returned by Describe.
	Version string
	// Types are the component types the plugin provides; each must have a
	// unique Name, a filter, scorer or picker Kind, and New set.
	Types []TypeInfo
	// Logger is optional. The default logs JSON to stderr (which go-plugin
	// forwards to the router's log) at the level SWITCHYARD_PLUGIN_LOG_LEVEL
	// names, info by default. Never write to stdout: go-plugin owns it.
	Logger hclog.Logger
}

// Serve serves opts.Types to the router and blocks until the router ends
// the plugin. It exits the process with status 1 when opts are invalid (no
// type, a duplicate name, a nil New) or when the parent process dies.
func Serve(opts ServeOpts) {
	log := opts.Logger
	if log == nil {
		log = defaultLogger()
	}
	if err := validateTypes(opts.Types); err != nil {
		log.Error("invalid plugin types", "error", err)
		os.Exit(1)
	}
	go watchParent(log, os.Getppid(), 250*time.Millisecond, func() { os.Exit(1) })
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{
			APIVersion: {PluginSetKey: &GRPCPlugin{Version: opts.Version, Types: opts.Types, Logger: log}},
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

// watchParent calls exit when the parent pid is no longer ppid (the router
// died and the process was reparented), checking every interval.
func watchParent(log hclog.Logger, ppid int, interval time.Duration, exit func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if now := os.Getppid(); now != ppid {
			log.Error("parent process exited; stopping", "parent_pid", ppid, "new_parent_pid", now)
			exit()
			return
		}
	}
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
		case KindFilter, KindScorer, KindPicker:
		case KindClassifier:
			problems = append(problems, fmt.Sprintf("type %q: classifiers cannot be served out of process yet", t.Name))
		default:
			problems = append(problems, fmt.Sprintf("type %q has invalid kind %d", t.Name, t.Kind))
		}
		for _, p := range t.Params {
			if p.Default == nil {
				continue
			}
			v, err := valueToProto(p.Default)
			if err == nil {
				_, err = valueFromProto(v, p.Type)
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
