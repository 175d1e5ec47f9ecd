// Command envoysim runs the test harness internal/envoysim as a process:
// an HTTP reverse proxy that stands in for Envoy with its ext_proc filter
// in front of an endpoint picker (`router epp`), for the walk-through of
// docs/epp.md ("Try it on one machine"), so that trying the EPP needs no
// code written. From the repository's root:
//
//	go run ./scripts/envoysim --epp 127.0.0.1:9002 --listen 127.0.0.1:8080
//
// It prints "envoysim listening on http://ADDR" once it accepts
// connections, and stops on SIGINT or SIGTERM. Exit status 2 on a usage
// error, 1 when it cannot listen or serve.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/switchyard-router/switchyard/internal/envoysim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, serves the proxy until ctx ends, and returns the exit
// status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("envoysim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	eppAddr := fs.String("epp", "127.0.0.1:9002", "the endpoint picker's ext_proc gRPC address (router epp --listen)")
	listen := fs.String("listen", "127.0.0.1:8080", "address the proxy serves HTTP on")
	mode := fs.String("mode", "full-duplex", "body processing mode: full-duplex (as the Gateway API Inference Extension configures Envoy) or buffered")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "envoysim: takes no arguments, got %q\n", fs.Args())
		return 2
	}
	cfg := envoysim.Config{EPP: *eppAddr}
	switch *mode {
	case "full-duplex":
		cfg.Mode = envoysim.FullDuplex
	case "buffered":
		cfg.Mode = envoysim.Buffered
	default:
		fmt.Fprintf(stderr, "envoysim: --mode %q: want full-duplex or buffered\n", *mode)
		return 2
	}
	p, err := envoysim.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "envoysim:", err)
		return 2
	}
	defer func() { _ = p.Close() }()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "envoysim: --listen %s: %v\n", *listen, err)
		return 1
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "envoysim listening on http://%s (ext_proc to %s, %s)\n", ln.Addr(), *eppAddr, cfg.Mode)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err = <-done:
		fmt.Fprintln(stderr, "envoysim:", err)
		return 1
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return 0
	}
}
