package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// runFloor is case (f), the floor of a process hop: the least an HTTP/1.1
// forwarder can do, without net/http's server or Transport. Each client
// connection gets one upstream connection of its own (to the targets in
// turn, round-robin per client connection) and one goroutine that, per
// request, reads it (http.ReadRequest), reads its body fully, writes it
// upstream, reads the answer (http.ReadResponse) and its body fully and
// writes it back. No pooling, no header rewriting beyond what
// Request.Write and Response.Write do, no concurrency within a
// connection. Any error closes both connections.
func runFloor(args []string) error {
	listen, ups, err := forwarderFlags("floor", args)
	if err != nil {
		return err
	}
	var next uint64
	return serveConns("floor", *listen, func(cc net.Conn) {
		up := ups[next%uint64(len(ups))]
		next++
		go floorConn(cc, up)
	})
}

// serveConns accepts connections on listen and hands each to accepted
// (in the accepting goroutine, which accepted must not block), printing
// "NAME listening on http://ADDR" once bound, until SIGINT or SIGTERM:
// the server of cases (f) and (t).
func serveConns(name, listen string, accepted func(net.Conn)) error {
	return serveUntilSignal(name, listen, func(ln net.Listener) error {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return err
			}
			accepted(cc)
		}
	}, nil)
}

// serveUntilSignal listens on listen (TCP), prints "NAME listening on
// http://ADDR" once bound and runs serve on the listener until serve
// returns (its error is returned) or SIGINT or SIGTERM comes; then it
// calls shutdown, when not nil, with 2 s to finish, and closes the
// listener. It is the accept-and-stop loop of every forwarder case.
func serveUntilSignal(name, listen string, serve func(net.Listener) error, shutdown func(context.Context) error) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("%s listening on http://%s\n", name, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if shutdown != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}
	ln.Close()
	return nil
}

// floorConn serves one client connection over its own upstream
// connection to up until either side closes or fails.
func floorConn(cc net.Conn, up *url.URL) {
	defer cc.Close()
	uc, err := net.DialTimeout("tcp", up.Host, 5*time.Second)
	if err != nil {
		return
	}
	defer uc.Close()
	ur, uw := bufio.NewReader(uc), bufio.NewWriter(uc)
	forwardConn(cc, func() *url.URL { return up }, func(req *http.Request) (*http.Response, error) {
		if err := req.Write(uw); err != nil {
			return nil, err
		}
		if err := uw.Flush(); err != nil {
			return nil, err
		}
		return http.ReadResponse(ur, req)
	})
}

// forwardConn is the floor's connection loop: per request on cc, read it
// (http.ReadRequest) and its body fully, send it to pick()'s host with
// roundTrip, read the answer's body fully and write the answer back with
// a Content-Length, until either side closes or fails. A chunked request
// body is refused (the bench sends none).
func forwardConn(cc net.Conn, pick func() *url.URL, roundTrip func(*http.Request) (*http.Response, error)) {
	cr, cw := bufio.NewReader(cc), bufio.NewWriter(cc)
	var reqBody, respBody bytes.Buffer
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		if len(req.TransferEncoding) > 0 {
			_, _ = io.WriteString(cc, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		}
		reqBody.Reset()
		if _, err := reqBody.ReadFrom(req.Body); err != nil {
			return
		}
		req.Body.Close()
		setBody(&req.Body, &req.ContentLength, reqBody.Bytes())
		up := pick()
		req.RequestURI = ""
		req.URL.Scheme, req.URL.Host = up.Scheme, up.Host
		req.Host = "" // Host: the target's, as ReverseProxy's SetURL does
		resp, err := roundTrip(req)
		if err != nil {
			return
		}
		respBody.Reset()
		_, err = respBody.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil {
			return
		}
		// The whole body is in hand: send it with a Content-Length even if
		// it came chunked.
		resp.TransferEncoding = nil
		setBody(&resp.Body, &resp.ContentLength, respBody.Bytes())
		if err := resp.Write(cw); err != nil {
			return
		}
		if err := cw.Flush(); err != nil {
			return
		}
		if req.Close || resp.Close {
			return
		}
	}
}

// setBody replaces a body that has been read fully into b. An empty body
// becomes http.NoBody so that Request.Write does not probe it.
func setBody(body *io.ReadCloser, length *int64, b []byte) {
	*length = int64(len(b))
	if len(b) == 0 {
		*body = http.NoBody
		return
	}
	*body = io.NopCloser(bytes.NewReader(b))
}
