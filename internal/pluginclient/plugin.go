package pluginclient

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/switchyard-router/switchyard/shared"
)

// Options tune the Clients a plugin set dispenses.
type Options struct {
	// DecideBatch, when set, is called once per DecideBatch message, just
	// before it is sent, with the number of tasks in it (>= 1). It runs on
	// the stream's sending goroutine, so no later batch is sent before it
	// returns: it must be quick (a metric's Observe).
	DecideBatch func(tasks int)
	// EventsBroken, when set, is called once if the Events stream fails
	// while the client is open (not when it closes, nor when done ends):
	// from then on every event for the plugin is dropped and counted
	// (EventStats.Dropped), so its listeners' state no longer follows the
	// requests. A host restarts the plugin then, as after a crash (a fresh
	// process starts from a clean state). It runs on the event sender's
	// goroutine.
	EventsBroken func(err error)
}

// PluginSets returns the VersionedPlugins of the router's
// plugin.ClientConfig: API version shared.APIVersion dispenses a *Client
// with opts under shared.PluginSetKey.
func PluginSets(opts Options) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{shared.APIVersion: {shared.PluginSetKey: &hostPlugin{opts: opts}}}
}

// hostPlugin is the host side of the go-plugin plugin: it dispenses a
// *Client and serves nothing.
type hostPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	opts Options
}

var _ plugin.GRPCPlugin = (*hostPlugin)(nil)

// GRPCServer refuses: the router does not serve plugins (shared.GRPCPlugin
// does, in the plugin's process).
func (*hostPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("the router's plugin client does not serve")
}

// GRPCClient returns a *Client over conn. ctx is go-plugin's context for
// the plugin process: it is cancelled when the process exits, which ends
// the client's streams.
func (p *hostPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return New(ctx, conn, p.opts), nil
}
