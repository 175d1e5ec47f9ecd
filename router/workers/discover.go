package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
)

// KVSource is one KV-event publisher of an engine (one per data-parallel
// rank), as the engine reports it: vLLM's GET /kv_event_sources (vLLM PR
// 55844) or SGLang's GET /server_info "kv_events" block (SGLang PR
// 25844). Hosts the engine reports as a wildcard ("*", "0.0.0.0", "::",
// empty) or as its own loopback ("localhost", 127.0.0.0/8, "::1") are
// replaced by the worker URL's host, so every endpoint is one the router
// can dial.
type KVSource struct {
	// Rank is the data-parallel rank the publisher serves (vLLM's
	// data_parallel_rank; SGLang's rank in 0..dp_size-1).
	Rank int
	// Endpoint is the rank's own PUB socket, "tcp://HOST:PORT": already
	// the rank's port (vLLM reports each rank's; SGLang's is its
	// endpoint_port_base + rank), so the subscriber must not add the rank
	// again.
	Endpoint string
	// ReplayEndpoint is the rank's ROUTER socket replaying events from a
	// sequence number ("tcp://HOST:PORT"); "" when none (SGLang reports
	// none).
	ReplayEndpoint string
	// SnapshotEndpoint is the rank's snapshot service (vLLM PR 57789's
	// snapshot_endpoint, "tcp://HOST:PORT"); "" when none.
	SnapshotEndpoint string
	// Topic is the subscription's topic prefix; "" takes every topic.
	Topic string
}

// Bounds of what an engine's discovery endpoints answer.
const (
	// maxSourcesBytes bounds GET /kv_event_sources' answer (1 MiB: more
	// than MaxRanks sources of MaxEndpointBytes each).
	maxSourcesBytes = 1 << 20
	// maxServerInfoBytes bounds GET /server_info's answer (4 MiB: SGLang
	// lists every server argument there).
	maxServerInfoBytes = 4 << 20
	// MaxEndpointBytes bounds a reported endpoint or topic.
	MaxEndpointBytes = 512
	// maxPort is the largest TCP port.
	maxPort = 65535
)

// ErrSources: an engine's discovery endpoint answered 200 with something
// that is not its KV-event sources: not JSON of the shape the engine
// documents, more than MaxRanks sources, a rank twice, an endpoint that
// is not "tcp://HOST:PORT" with a port from 1 to 65535, or a string over
// MaxEndpointBytes.
var ErrSources = errors.New("kv event sources unusable")

// discovery is what an engine says of its KV-event publishers.
type discovery struct {
	// sources, sorted by rank; nil when the engine reports none (it has
	// no discovery endpoint, or publishes no events).
	sources []KVSource
	// blockSize is the block size the engine says its events are hashed
	// at (SGLang's kv_events.block_size, else its page_size); 0 unknown.
	blockSize int64
	// from names the endpoint that answered ("" when none did).
	from string
	// skipped says, in plain words, which sources were left out and why
	// (an ipc:// endpoint, a port 0); "" when none were.
	skipped string
}

// discover asks w's engine for its KV-event publishers, each GET within
// timeout: vLLM's GET base + "/kv_event_sources" (both revisions: the
// {"sources": [...]} envelope and a bare array), and when that answers
// 404, SGLang's GET base + "/server_info", then "/get_server_info" (older
// SGLang). Every one answering 404 means the engine reports none (older
// vLLM, SGLang without --kv-events-config). Any other failure is an error
// (the caller keeps what it had).
func discover(ctx context.Context, c *http.Client, base string, timeout time.Duration) (discovery, error) {
	host := ""
	if u, err := neturl.Parse(base); err == nil {
		host = u.Hostname()
	}
	body, err := getBody(ctx, c, base+"/kv_event_sources", timeout, maxSourcesBytes)
	if err == nil {
		d, err := parseVLLMSources(body, host)
		if err != nil {
			return discovery{}, fmt.Errorf("%w: %s: %w", ErrSources, base+"/kv_event_sources", err)
		}
		d.from = base + "/kv_event_sources"
		return d, nil
	}
	if !notFound(err) {
		return discovery{}, err
	}
	for _, path := range []string{"/server_info", "/get_server_info"} {
		body, err := getBody(ctx, c, base+path, timeout, maxServerInfoBytes)
		if notFound(err) {
			continue
		}
		if err != nil {
			return discovery{}, err
		}
		d, err := parseSGLangServerInfo(body, host)
		if err != nil {
			return discovery{}, fmt.Errorf("%w: %s: %w", ErrSources, base+path, err)
		}
		d.from = base + path
		return d, nil
	}
	return discovery{}, nil
}

func notFound(err error) bool {
	se := (*StatusError)(nil)
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

// getBody GETs url and reads its answer, of at most limit bytes.
func getBody(ctx context.Context, c *http.Client, url string, timeout time.Duration, limit int64) ([]byte, error) {
	resp, err := get(ctx, c, url, "application/json", timeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil && isTimeout(err):
		return nil, fmt.Errorf("%w: the answer of %s took longer than %s", ErrTimeout, url, timeout)
	case err != nil:
		return nil, fmt.Errorf("GET %s: %s", url, clip(err.Error()))
	case int64(len(b)) > limit:
		return nil, fmt.Errorf("%w: the answer of %s is over %d KiB", ErrSources, url, limit>>10)
	}
	return b, nil
}

// vllmSource is one entry of vLLM's GET /kv_event_sources: the engine
// core's resolved KVEventsConfig for its data-parallel rank
// (vllm/entrypoints/serve/kv_events/api_router.py). Unknown fields
// (publisher, buffer_steps, hwm...) are ignored.
type vllmSource struct {
	Rank             *int    `json:"data_parallel_rank"`
	Endpoint         string  `json:"endpoint"`
	ReplayEndpoint   *string `json:"replay_endpoint"`
	SnapshotEndpoint *string `json:"snapshot_endpoint"`
	Topic            string  `json:"topic"`
	Publisher        string  `json:"publisher"`
	Encoding         string  `json:"encoding"`
}

// parseVLLMSources reads vLLM's GET /kv_event_sources answer: a
// {"sources": [...]} envelope (vLLM f123199a, tests/entrypoints/serve/
// test_kv_events_router.py) or a bare array (vLLM 153c3aa2,
// tests/entrypoints/serve/kv_events/test_api_router.py). Hosts are
// resolved against host.
func parseVLLMSources(body []byte, host string) (discovery, error) {
	var list []vllmSource
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(trimmed) > 0 && trimmed[0] == '[':
		if err := json.Unmarshal(body, &list); err != nil {
			return discovery{}, fmt.Errorf("not a list of sources: %s", clip(err.Error()))
		}
	default:
		var env struct {
			Sources *[]vllmSource `json:"sources"`
		}
		if err := json.Unmarshal(body, &env); err != nil {
			return discovery{}, fmt.Errorf("not {\"sources\": [...]} nor a list: %s", clip(err.Error()))
		}
		if env.Sources == nil {
			return discovery{}, errors.New(`an object without "sources"`)
		}
		list = *env.Sources
	}
	if len(list) > MaxRanks {
		return discovery{}, fmt.Errorf("%d sources, more than %d", len(list), MaxRanks)
	}
	var d discovery
	var skipped []string
	for i, s := range list {
		rank := 0
		if s.Rank != nil {
			rank = *s.Rank
		}
		if rank < 0 || rank >= MaxRanks {
			return discovery{}, fmt.Errorf("source %d: data_parallel_rank %d is not in 0..%d", i, rank, MaxRanks-1)
		}
		if (s.Publisher != "" && !strings.EqualFold(s.Publisher, "zmq")) || (s.Encoding != "" && !strings.EqualFold(s.Encoding, "msgpack")) {
			skipped = append(skipped, fmt.Sprintf("rank %d: publisher %q, encoding %q (the router reads zmq and msgpack)",
				rank, untrusted.Text(s.Publisher, 32), untrusted.Text(s.Encoding, 32)))
			continue
		}
		src := KVSource{Rank: rank}
		var err error
		var why string
		if src.Endpoint, why, err = resolveEndpoint(s.Endpoint, host); err != nil {
			return discovery{}, fmt.Errorf("rank %d: endpoint: %w", rank, err)
		}
		if why != "" {
			skipped = append(skipped, fmt.Sprintf("rank %d: %s", rank, why))
			continue
		}
		if src.ReplayEndpoint, err = optionalEndpoint(s.ReplayEndpoint, host); err != nil {
			return discovery{}, fmt.Errorf("rank %d: replay_endpoint: %w", rank, err)
		}
		if src.SnapshotEndpoint, err = optionalEndpoint(s.SnapshotEndpoint, host); err != nil {
			return discovery{}, fmt.Errorf("rank %d: snapshot_endpoint: %w", rank, err)
		}
		if src.Topic, err = topic(s.Topic); err != nil {
			return discovery{}, fmt.Errorf("rank %d: %w", rank, err)
		}
		d.sources = append(d.sources, src)
	}
	if err := sortRanks(d.sources); err != nil {
		return discovery{}, err
	}
	d.skipped = strings.Join(skipped, "; ")
	return d, nil
}

// sglangServerInfo is the part of SGLang's GET /server_info (and
// /get_server_info) the router reads: the server arguments' page_size, and
// the kv_events descriptor of describe_kv_events_publisher (SGLang PR
// 25844; null when the server publishes no events).
type sglangServerInfo struct {
	PageSize json.Number `json:"page_size"`
	KVEvents *struct {
		Publisher        string      `json:"publisher"`
		EndpointHost     string      `json:"endpoint_host"`
		EndpointPortBase json.Number `json:"endpoint_port_base"`
		Topic            string      `json:"topic"`
		BlockSize        json.Number `json:"block_size"`
		DPSize           json.Number `json:"dp_size"`
	} `json:"kv_events"`
}

// parseSGLangServerInfo reads SGLang's GET /server_info answer: one
// source per rank in 0..dp_size-1 (1 when absent) at endpoint_host, port
// endpoint_port_base + rank, and the block size its events are hashed at
// (kv_events.block_size, else page_size). vLLM's /server_info (dev mode
// only) has neither field, and reports none.
func parseSGLangServerInfo(body []byte, host string) (discovery, error) {
	var info sglangServerInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return discovery{}, fmt.Errorf("not a server_info object: %s", clip(err.Error()))
	}
	var d discovery
	if n, ok := wholeNumber(info.PageSize, maxCapacityTokens); ok {
		d.blockSize = n
	}
	k := info.KVEvents
	if k == nil {
		return d, nil
	}
	if n, ok := wholeNumber(k.BlockSize, maxCapacityTokens); ok {
		d.blockSize = n
	}
	if k.Publisher != "" && !strings.EqualFold(k.Publisher, "zmq") {
		d.skipped = fmt.Sprintf("publisher %q (the router reads zmq)", untrusted.Text(k.Publisher, 32))
		return d, nil
	}
	base, ok := wholeNumber(k.EndpointPortBase, maxPort)
	if !ok {
		return discovery{}, fmt.Errorf("kv_events.endpoint_port_base %q is not a port from 1 to %d", untrusted.Text(k.EndpointPortBase.String(), 32), maxPort)
	}
	dp := int64(1)
	if k.DPSize != "" {
		if dp, ok = wholeNumber(k.DPSize, MaxRanks); !ok {
			return discovery{}, fmt.Errorf("kv_events.dp_size %q is not a number from 1 to %d", untrusted.Text(k.DPSize.String(), 32), MaxRanks)
		}
	}
	if base+dp-1 > maxPort {
		return discovery{}, fmt.Errorf("kv_events.endpoint_port_base %d + dp_size %d passes port %d", base, dp, maxPort)
	}
	t, err := topic(k.Topic)
	if err != nil {
		return discovery{}, err
	}
	if len(k.EndpointHost) > MaxEndpointBytes {
		return discovery{}, fmt.Errorf("kv_events.endpoint_host of %d bytes, more than %d", len(k.EndpointHost), MaxEndpointBytes)
	}
	h := k.EndpointHost
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	h = dialHost(h, host)
	if !validHost(h) {
		return discovery{}, fmt.Errorf("kv_events.endpoint_host %q is not a host", untrusted.Text(k.EndpointHost, 64))
	}
	for r := range dp {
		d.sources = append(d.sources, KVSource{
			Rank:     int(r),
			Endpoint: "tcp://" + net.JoinHostPort(h, strconv.FormatInt(base+r, 10)),
			Topic:    t,
		})
	}
	return d, nil
}

// wholeNumber reads n as a whole number from 1 to max.
func wholeNumber(n json.Number, max int64) (int64, bool) {
	v, err := n.Int64()
	return v, err == nil && v >= 1 && v <= max
}

// topic checks a reported topic's length.
func topic(t string) (string, error) {
	if len(t) > MaxEndpointBytes {
		return "", fmt.Errorf("topic of %d bytes, more than %d", len(t), MaxEndpointBytes)
	}
	return t, nil
}

// sortRanks sorts sources by rank and refuses a rank listed twice.
func sortRanks(sources []KVSource) error {
	slices.SortFunc(sources, func(a, b KVSource) int { return a.Rank - b.Rank })
	for i := 1; i < len(sources); i++ {
		if sources[i].Rank == sources[i-1].Rank {
			return fmt.Errorf("data_parallel_rank %d listed twice", sources[i].Rank)
		}
	}
	return nil
}

// optionalEndpoint resolves an optional endpoint: nil and "" are none.
func optionalEndpoint(s *string, host string) (string, error) {
	if s == nil || *s == "" {
		return "", nil
	}
	ep, why, err := resolveEndpoint(*s, host)
	if err != nil {
		return "", err
	}
	if why != "" {
		return "", nil // an ipc:// replay or snapshot endpoint: none the router can use
	}
	return ep, nil
}

// resolveEndpoint returns ep, a ZeroMQ endpoint an engine reported, as
// "tcp://HOST:PORT" with a wildcard or loopback host replaced by host.
// why is set (and ep "") for an endpoint that is well-formed but that the
// router cannot dial: another transport (ipc://, inproc://) or port 0 (a
// publisher that reports its configuration, not its bound port). Other
// malformed endpoints are errors.
func resolveEndpoint(ep, host string) (out, why string, err error) {
	if len(ep) > MaxEndpointBytes {
		return "", "", fmt.Errorf("%d bytes, more than %d", len(ep), MaxEndpointBytes)
	}
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		if i := strings.Index(ep, "://"); i > 0 && i <= 8 {
			return "", fmt.Sprintf("endpoint %q is not tcp://", untrusted.Text(ep, 64)), nil
		}
		return "", "", fmt.Errorf("%q is not \"tcp://HOST:PORT\"", untrusted.Text(ep, 64))
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", "", fmt.Errorf("%q is not \"tcp://HOST:PORT\"", untrusted.Text(ep, 64))
	}
	port, err := strconv.Atoi(p)
	switch {
	case err != nil || port < 0 || port > maxPort:
		return "", "", fmt.Errorf("%q: the port is not a number from 1 to %d", untrusted.Text(ep, 64), maxPort)
	case port == 0:
		return "", fmt.Sprintf("endpoint %q has port 0 (not bound yet)", untrusted.Text(ep, 64)), nil
	}
	h = dialHost(h, host)
	if !validHost(h) {
		return "", "", fmt.Errorf("%q names no host the router can dial", untrusted.Text(ep, 64))
	}
	return "tcp://" + net.JoinHostPort(h, p), "", nil
}

// validHost reports whether h is a host name or an IP address (an IPv6
// one possibly with a zone): letters, digits, '.', '-', '_', ':' and '%'
// only, so that nothing else from the engine reaches an endpoint, a log
// line or a socket.
func validHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(".-_:%", c) >= 0) {
			return false
		}
	}
	return true
}

// dialHost returns h, a host an engine reported, as one the router can
// dial: a wildcard ("*", "0.0.0.0", "::", "") or a loopback address
// ("localhost", 127.0.0.0/8, "::1"), meaning the engine's own host, is
// replaced by workerHost.
func dialHost(h, workerHost string) string {
	switch strings.ToLower(h) {
	case "", "*", "0.0.0.0", "::", "localhost":
		return workerHost
	}
	if ip := net.ParseIP(h); ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		return workerHost
	}
	return h
}
