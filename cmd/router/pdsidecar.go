package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/epp/sidecar"
	"github.com/switchyard-router/switchyard/router/live"
)

// pdSidecarDrain bounds how long `router pd-sidecar` lets requests in
// flight end after SIGTERM.
const pdSidecarDrain = 30 * time.Second

func newPDSidecarCmd() *cobra.Command {
	var (
		listen, engine string
		allow          []string
		maxBody        int64
	)
	cmd := &cobra.Command{
		Use:   "pd-sidecar --engine URL [--listen ADDR]",
		Short: "Run the routing sidecar of a decode pod in a disaggregated fleet behind router epp",
		Long: `pd-sidecar stands in front of a decode engine, in its pod, as llm-d's routing
sidecar does (llm-d's P/D protocol): every request passes through to --engine,
except a POST to /v1/chat/completions, /v1/completions, /v1/responses or
/v1/messages carrying x-prefiller-host-port, which router epp sets on a
disaggregated model's request when it routes it to this decode pod. That one
runs in two hops, as vLLM's disaggregated-serving proxies run it: the prefill
request (kv_transfer_params with do_remote_decode, one token, not streamed)
to the prefill endpoint the header names, then the request with the prefill
answer's kv_transfer_params to --engine, whose answer goes back as it comes.
The header never reaches the engine.

Point the InferencePool's target port at --listen and run the engine on
another port of the pod (llm-d: --port 8000, --vllm-port 8001). With
--prefill-allow, only prefill endpoints whose IP address is in one of its
networks are used (another is answered 403, as llm-d's SSRF protection does).

It prints "router pd-sidecar listening on http://ADDR" once it accepts
requests; SIGTERM or SIGINT lets the requests in flight end (up to 30 s) and
exits 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := url.Parse(engine)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("--engine %q: want the engine's base URL, http://HOST:PORT", engine)
			}
			var prefixes []netip.Prefix
			for _, a := range allow {
				p, err := parseAllow(a)
				if err != nil {
					return fmt.Errorf("--prefill-allow %q: %w", a, err)
				}
				prefixes = append(prefixes, p)
			}
			if maxBody < minBodyBound || maxBody > live.DefaultMaxBodyBytes {
				return fmt.Errorf("--max-body-bytes %d: want %s", maxBody, maxBodyWant)
			}
			logger := hclog.New(&hclog.LoggerOptions{Name: "pd-sidecar", Output: cmd.ErrOrStderr(), Level: logLevel(cmd.Context(), hclog.Info)})
			h, err := sidecar.New(sidecar.Config{Engine: u, AllowPrefill: prefixes, MaxBodyBytes: maxBody, Logger: logger})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return &exitError{code: 1, err: fmt.Errorf("--listen %s: %w", listen, err)}
			}
			return servePDSidecar(cmd.Context(), cmd, ln, h)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8000", "address to listen on (host:port; port 0 picks a free one): the InferencePool's target port")
	f.StringVar(&engine, "engine", "http://127.0.0.1:8001", "the local decode engine's base URL")
	f.StringSliceVar(&allow, "prefill-allow", nil, "networks a prefill endpoint's IP address must be in, CIDR,CIDR... (an address alone is one host); default: any endpoint")
	f.Int64Var(&maxBody, "max-body-bytes", live.DefaultMaxBodyBytes, "bound on a two-hop request's body, in bytes: a larger one is answered 413")
	setWant(f, "max-body-bytes", maxBodyWant)
	return cmd
}

// parseAllow reads one --prefill-allow entry: a CIDR prefix, or an IP
// address (a prefix of one host).
func parseAllow(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("want a network in CIDR notation (10.0.0.0/8) or an IP address: %w", err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("want a network in CIDR notation (10.0.0.0/8) or an IP address: %w", err)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// servePDSidecar serves h on ln until ctx ends, then drains.
func servePDSidecar(ctx context.Context, cmd *cobra.Command, ln net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(cmd.OutOrStdout(), "router pd-sidecar listening on http://%s\n", ln.Addr())
	select {
	case err := <-errc:
		return &exitError{code: 1, err: err}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), pdSidecarDrain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return &exitError{code: 1, err: err}
	}
	return nil
}
