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
	"sync"
	"sync/atomic"
	"time"
)

// The two split cases take the floor (f) and the bare proxy (b) apart,
// to say which half of net/http a hop pays for: each keeps one half of
// (b) and takes the other from (f).
//
//	(s) net/http's server with the floor's client: an http.Server whose
//	    handler reads the body, takes an idle upstream connection of its
//	    own pool (or dials one), writes the request and reads the answer
//	    on it in the handler's goroutine, and copies the answer back.
//	(t) the floor's server with net/http's client: the floor's
//	    connection loop (one goroutine per client connection reading
//	    requests with http.ReadRequest) sending each request through an
//	    http.Transport with (b)'s settings.
//
// (s) - (f) is what net/http's server costs a hop over a hand-written
// loop, (t) - (f) what its Transport costs.

// runSplitServer is case (s): net/http's server, the floor's client.
func runSplitServer(args []string) error {
	listen, ups, err := forwarderFlags("split-server", args)
	if err != nil {
		return err
	}
	pools := make([]*connPool, len(ups))
	for i, u := range ups {
		pools[i] = &connPool{host: u.Host}
	}
	var next atomic.Uint64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := (next.Add(1) - 1) % uint64(len(ups))
		status, header, body, err := pools[i].roundTrip(r, ups[i])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, vs := range header {
			if k == "Connection" || k == "Transfer-Encoding" {
				continue
			}
			w.Header()[k] = vs
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
	return serveHTTP("split-server", *listen, h)
}

// connPool is (s)'s client: idle keep-alive connections to one host,
// each used by one request at a time in the caller's goroutine.
type connPool struct {
	host string
	mu   sync.Mutex
	idle []*poolConn
}

type poolConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// roundTrip sends r (its body read fully) to up over an idle connection
// of the pool and returns the answer's status, header and whole body.
func (p *connPool) roundTrip(r *http.Request, up *url.URL) (int, http.Header, []byte, error) {
	reqBody, err := io.ReadAll(r.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	p.mu.Lock()
	var pc *poolConn
	if n := len(p.idle); n > 0 {
		pc, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if pc == nil {
		c, err := net.DialTimeout("tcp", p.host, 5*time.Second)
		if err != nil {
			return 0, nil, nil, err
		}
		pc = &poolConn{c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}
	}
	out := r.Clone(context.Background())
	setBody(&out.Body, &out.ContentLength, reqBody)
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = up.Scheme, up.Host
	out.Host = ""
	out.Header.Del("Connection")
	fail := func(err error) (int, http.Header, []byte, error) {
		pc.c.Close()
		return 0, nil, nil, err
	}
	if err := out.Write(pc.w); err != nil {
		return fail(err)
	}
	if err := pc.w.Flush(); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(pc.r, out)
	if err != nil {
		return fail(err)
	}
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil || resp.Close {
		pc.c.Close()
	} else {
		p.mu.Lock()
		p.idle = append(p.idle, pc)
		p.mu.Unlock()
	}
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, body.Bytes(), nil
}

// runSplitClient is case (t): the floor's server, net/http's client.
func runSplitClient(args []string) error {
	listen, ups, err := forwarderFlags("split-client", args)
	if err != nil {
		return err
	}
	tr := engineTransport()
	var next atomic.Uint64
	pick := func() *url.URL { return ups[(next.Add(1)-1)%uint64(len(ups))] }
	return serveConns("split-client", *listen, func(cc net.Conn) { go splitClientConn(cc, tr, pick) })
}

// splitClientConn is floorConn with each request sent through tr.
func splitClientConn(cc net.Conn, tr http.RoundTripper, pick func() *url.URL) {
	defer cc.Close()
	forwardConn(cc, pick, tr.RoundTrip)
}
