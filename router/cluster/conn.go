package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-router/switchyard/router/config"
)

// reconnectWait is how often a connection to NATS is tried again while
// NATS is away.
const reconnectWait = 250 * time.Millisecond

// connect opens a connection to c's NATS server named name, which
// reconnects by itself forever (every reconnectWait), also when the
// server is away at first; up hears each connection (true) and loss
// (false). Errors: a NATS URL the client refuses.
func connect(c config.Cluster, name string, up func(bool)) (*nats.Conn, error) {
	nc, err := nats.Connect(c.NATS,
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ConnectHandler(func(*nats.Conn) { up(true) }),
		nats.ReconnectHandler(func(*nats.Conn) { up(true) }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { up(false) }),
	)
	if err != nil {
		return nil, fmt.Errorf("cluster: nats %s: %w", c.NATS, err)
	}
	return nc, nil
}

// keepJoined keeps what join makes on nc (a consumer, a watch) running
// until ctx ends, then stops it: join runs once nc is connected, again
// after each reconnection (a restarted NATS server keeps no memory stream
// or bucket, so what was joined starts over, its stop called first), and
// every second after it failed (logged as what). events carries nc's ups
// (true) and downs (false).
func keepJoined(ctx context.Context, nc *nats.Conn, events <-chan bool, log hclog.Logger, what string, join func() (stop func(), err error)) {
	var stop func()
	var joined uint64 // the connection (its reconnect count) join ran on
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case up := <-events:
			if !up || (stop != nil && joined == nc.Stats().Reconnects) {
				continue
			}
			if stop != nil {
				stop()
				stop = nil
			}
			retry.Reset(0)
		case <-retry.C:
			if stop != nil || !nc.IsConnected() {
				continue
			}
			joined = nc.Stats().Reconnects
			s, err := join()
			if err != nil {
				log.Warn(what+"; retrying", "error", err)
				retry.Reset(time.Second)
				continue
			}
			stop = s
		}
	}
}
