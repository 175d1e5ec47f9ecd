package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/router/config"
)

// reconnectWait is how often a connection to NATS is tried again while
// NATS is away.
const reconnectWait = 250 * time.Millisecond

// natsErrorLogInterval is how often NATS's asynchronous errors of one
// cause (a slow consumer, a permissions violation, ...) are logged after
// the first: each line says how many were held back.
const natsErrorLogInterval = 10 * time.Second

// maxSecretFile bounds what is read of a credentials, nkey seed or token
// file: a few KiB at most in practice.
const maxSecretFile = 64 << 10

// connect opens a connection to c's NATS servers named name, which
// reconnects by itself forever (every reconnectWait); up hears each
// connection (true) and loss (false); log receives NATS's asynchronous
// errors (rate-limited per cause) and the connection closing for good.
//
// It tries once at once: NATS refusing this replica (its credentials, its
// certificate, TLS required or refused) is an error, returned, and so is
// a credentials, nkey, token or TLS file that cannot be read. NATS not
// reachable (no server answers, a timeout) is not: the connection is
// returned and retried in the background, also when the server is away at
// first; if NATS then refuses the credentials twice in a row, the
// connection is closed for good and logged (nats.go's rule). Errors never
// quote a password or token: URLs are redacted (config.RedactNATS).
// Close the connection with closeConn (not nc.Close: the close would be
// logged as NATS's).
func connect(c config.Cluster, name string, log hclog.Logger, up func(bool)) (nc *nats.Conn, closeConn func(), err error) {
	closing := new(atomic.Bool)
	opts, err := natsOptions(c, name, log, up, closing)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: nats %s: %w", config.RedactNATS(c.NATS), err)
	}
	nc, err = nats.Connect(c.NATS, opts...)
	if err != nil && unreachable(err) {
		nc, err = nats.Connect(c.NATS, append(opts, nats.RetryOnFailedConnect(true))...)
	}
	switch {
	case err == nil:
	case natsErrorCause(err) == "authorization":
		return nil, nil, fmt.Errorf("cluster: nats %s refused this replica's %s: %w", config.RedactNATS(c.NATS), authMethod(c), err)
	case c.TLS != nil || strings.Contains(c.NATS, "tls://"):
		return nil, nil, fmt.Errorf("cluster: nats %s (with TLS, the tls block): %w", config.RedactNATS(c.NATS), err)
	default:
		return nil, nil, fmt.Errorf("cluster: nats %s: %w", config.RedactNATS(c.NATS), err)
	}
	return nc, func() {
		closing.Store(true)
		nc.Close()
	}, nil
}

// authMethod names how c authenticates to NATS, for errors.
func authMethod(c config.Cluster) string {
	switch {
	case c.Credentials != "":
		return "credentials (" + c.Credentials + ")"
	case c.NKey != "":
		return "nkey (" + c.NKey + ")"
	case c.Token != "":
		return "token"
	case c.TokenFile != "":
		return "token_file (" + c.TokenFile + ")"
	case strings.Contains(c.NATS, "@"):
		return "user in the nats URL"
	}
	return "connection without credentials (set credentials, nkey, token_file or a user in the URL)"
}

// unreachable reports whether err (of a first connection) says NATS is
// not there now, rather than that it refuses this replica.
func unreachable(err error) bool {
	var op *net.OpError
	var ne net.Error
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &op) && op.Op == "dial" || errors.As(err, &ne) && ne.Timeout()
}

// natsOptions are the nats.go options of a connection of c: its name,
// reconnection forever, c's credentials and TLS, and the handlers of
// connection changes and asynchronous errors (logged on log through an
// untrusted.Limiter; the connection closing is logged unless closing is
// set). Errors: a credentials, nkey seed, token or TLS file that cannot
// be read or does not parse (named by its attribute).
func natsOptions(c config.Cluster, name string, log hclog.Logger, up func(bool), closing *atomic.Bool) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ConnectHandler(func(*nats.Conn) { up(true) }),
		nats.ReconnectHandler(func(*nats.Conn) { up(true) }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { up(false) }),
		nats.ErrorHandler(asyncErrorHandler(log, untrusted.NewLimiter(natsErrorLogInterval))),
		nats.ClosedHandler(func(nc *nats.Conn) {
			up(false)
			if err := nc.LastError(); err != nil && !closing.Load() {
				log.Error("NATS closed the connection for good; this replica shares nothing more until it restarts",
					"connection", name, "error", untrusted.Text(err.Error(), 0))
			}
		}),
	}
	switch {
	case c.Credentials != "":
		b, err := readSecret(c.Credentials)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		_, jerr := nkeys.ParseDecoratedJWT(b)
		kp, kerr := nkeys.ParseDecoratedNKey(b)
		clear(b)
		if jerr != nil || kerr != nil {
			return nil, fmt.Errorf("credentials %s: not a NATS .creds file (a user JWT and its nkey seed)", c.Credentials)
		}
		kp.Wipe()
		opts = append(opts, nats.UserCredentials(c.Credentials))
	case c.NKey != "":
		if _, err := readSecret(c.NKey); err != nil {
			return nil, fmt.Errorf("nkey: %w", err)
		}
		o, err := nats.NkeyOptionFromSeed(c.NKey)
		if err != nil {
			return nil, fmt.Errorf("nkey %s: %w", c.NKey, err)
		}
		opts = append(opts, o)
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.TokenFile != "":
		b, err := readSecret(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token_file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		clear(b)
		if tok == "" {
			return nil, fmt.Errorf("token_file %s: empty", c.TokenFile)
		}
		opts = append(opts, nats.Token(tok))
	}
	if t := c.TLS; t != nil {
		var tlsOpts []nats.Option
		if t.CAFile != "" {
			tlsOpts = append(tlsOpts, nats.RootCAs(t.CAFile))
		}
		if t.CertFile != "" {
			tlsOpts = append(tlsOpts, nats.ClientCert(t.CertFile, t.KeyFile))
		}
		// RootCAs and ClientCert read their files when applied: apply
		// them once now, so that a bad file is an error naming the block.
		var scratch nats.Options
		for _, o := range tlsOpts {
			if err := o(&scratch); err != nil {
				return nil, fmt.Errorf("tls: %w", err)
			}
		}
		opts = append(opts, tlsOpts...)
	}
	return opts, nil
}

// readSecret reads a credentials, nkey seed or token file: at most
// maxSecretFile bytes, a regular file. The caller wipes the bytes.
func readSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSecretFile {
		clear(b)
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxSecretFile)
	}
	return b, nil
}

// asyncErrorHandler logs NATS's asynchronous errors (nats.ErrHandler: a
// slow consumer dropping messages, a permissions violation, an
// authorization error on a reconnect, ...) on log, at most one line per
// cause per natsErrorLogInterval (lim), each saying how many were held
// back. The server's error text and the subscription's subject are
// bounded and escaped (untrusted.Text): a server's error may quote a
// subject a peer chose. Without it nats.go prints each one on stderr.
func asyncErrorHandler(log hclog.Logger, lim *untrusted.Limiter) nats.ErrHandler {
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		if err == nil {
			return
		}
		cause := natsErrorCause(err)
		ok, suppressed := lim.Allow(cause)
		if !ok {
			return
		}
		args := []any{"cause", cause, "error", untrusted.Text(err.Error(), 0)}
		if sub != nil {
			args = append(args, "subject", untrusted.Text(sub.Subject, 0))
		}
		if suppressed > 0 {
			args = append(args, "suppressed", suppressed)
		}
		log.Warn("NATS reported an error (logged at most once per "+natsErrorLogInterval.String()+" per cause)", args...)
	}
}

// natsErrorCause names err's cause for asyncErrorHandler: one of a fixed
// set, never a string from outside.
func natsErrorCause(err error) string {
	switch {
	case errors.Is(err, nats.ErrSlowConsumer):
		return "slow_consumer"
	case errors.Is(err, nats.ErrPermissionViolation):
		return "permissions"
	case errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
		errors.Is(err, nats.ErrAccountAuthExpired):
		return "authorization"
	case errors.Is(err, nats.ErrConsumerNotActive):
		return "consumer"
	}
	return "other"
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
