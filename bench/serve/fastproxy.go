package main

import (
	"net/url"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// runFastProxy is case (x): the bare proxy (b) on fasthttp instead of
// net/http, server and client both (fastProxy). Against the floor (f) it
// says how close a well-kept HTTP library gets to a hand-written
// forwarder when it reads requests in the connection's goroutine and does
// the upstream I/O in the caller's, the shape (s) and (t) point to.
func runFastProxy(args []string) error {
	listen, ups, err := forwarderFlags("fastproxy", args)
	if err != nil {
		return err
	}
	srv := fastProxy(ups)
	return serveUntilSignal("fastproxy", *listen, srv.Serve, srv.ShutdownWithContext)
}

// fastProxy is a fasthttp.Server that forwards every request to ups in
// turn (round-robin per request), each target through a
// fasthttp.HostClient of its own (pooled keep-alive connections, at most
// fasthttp.DefaultMaxConnsPerHost, 512, idle ones closed after 90 s as
// (b)'s Transport does). The handler runs in the goroutine that reads the
// client's connection, and HostClient.Do writes the request and reads the
// answer in it too.
//
// The request goes on as it came (method, path and query, headers, the
// whole body) with the target's Host and without the Connection header;
// the answer comes back as the target gave it (status, headers but
// Connection, body) with a Content-Length: fasthttp's client reads the
// whole body before Do returns, so a streamed answer (server-sent events)
// reaches the client in one piece at its end, not chunk by chunk. A
// target that cannot be reached is answered 502 with the error's text.
// The server adds no Server, Date or default Content-Type header of its
// own.
func fastProxy(ups []*url.URL) *fasthttp.Server {
	clients := make([]*fasthttp.HostClient, len(ups))
	for i, u := range ups {
		clients[i] = &fasthttp.HostClient{
			Addr:                     u.Host,
			MaxIdleConnDuration:      90 * time.Second,
			NoDefaultUserAgentHeader: true,
		}
	}
	var next atomic.Uint64
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			i := (next.Add(1) - 1) % uint64(len(ups))
			ctx.Request.Header.Del("Connection")
			ctx.Request.SetHost(ups[i].Host)
			if err := clients[i].Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
				return
			}
			ctx.Response.Header.Del("Connection")
		},
		ReadTimeout:           10 * time.Second,
		IdleTimeout:           90 * time.Second,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
	}
}
