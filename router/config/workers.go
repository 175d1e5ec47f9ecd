package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// blockWorker is the worker block's name.
const blockWorker = "worker"

// Worker is one `worker "NAME"` block: an engine endpoint `router serve`
// routes to.
//
//	worker "gpu-0" {
//	  url             = "http://127.0.0.1:8001" # required; the rest is optional
//	  role            = "aggregated"          # default; or "prefill", "decode"
//	  models          = ["llama"]             # default: the engine's GET /v1/models
//	  total_kv_blocks = 4096                  # in router blocks; default: the engine's /metrics
//	  metrics_url     = ""                    # default: url + "/metrics"
//	  labels          = { zone = "eu-1" }     # default: none; plugins declaring LABELS see them
//	  kv_events {                             # optional: the engine's KV-event stream
//	    endpoint        = "tcp://127.0.0.1:5557"
//	    topic           = ""
//	    replay_endpoint = ""
//	  }
//	}
type Worker struct {
	// Name is the block label: unique, an identifier, not "default". The
	// router derives the worker's stable id from it.
	Name string
	// URL is the engine's base URL (scheme http or https, a host, an
	// optional path prefix), without a trailing "/" or "/v1": the router
	// appends /v1/chat/completions, /v1/models, /metrics and the other
	// endpoints' paths itself (see EngineBaseURL).
	URL string
	// GivenURL is the url attribute as written when the loader normalised
	// it into URL (a trailing "/", "/v1" or "/v1/" dropped); "" when URL
	// is as written. `router serve` logs both forms at info.
	GivenURL string
	// Role is the worker's serving role (shared.RoleAggregated by default).
	Role shared.Role
	// Models are the model names the worker serves, unique; nil when the
	// block sets none, and the router asks the engine (GET /v1/models).
	Models []string
	// TotalKVBlocks is the worker's KV capacity in router blocks of
	// router.block_size tokens (not in the engine's own blocks): an engine
	// with G GPU blocks of E tokens holds G*E/block_size router blocks. > 0
	// when set; 0 when the block sets none, and the router reads it from
	// the engine's metrics.
	TotalKVBlocks int64
	// MetricsURL is the engine's Prometheus endpoint: the block's
	// metrics_url, or URL + "/metrics" when unset or "".
	MetricsURL string
	// KVEvents is the block's kv_events block; nil when it has none.
	KVEvents *KVEvents
	// Labels are the block's `labels` map (see ValidLabel); nil when it
	// sets none. Plugins that declare the LABELS input see them, with the
	// router-set keys (shared.WorkerLabels). Kubernetes pod discovery sets
	// them to the pod's labels.
	Labels map[string]string
	// Range is the block's definition (`worker "NAME"`).
	Range hcl.Range
	// AttrRanges holds the range of each attribute given, by name.
	AttrRanges map[string]hcl.Range
}

// Equal reports whether w and o describe the same worker: every field but
// the ranges and GivenURL (two spellings of one base URL are one worker).
func (w Worker) Equal(o Worker) bool {
	return w.Name == o.Name && w.URL == o.URL && w.Role == o.Role &&
		slices.Equal(w.Models, o.Models) && w.TotalKVBlocks == o.TotalKVBlocks &&
		w.MetricsURL == o.MetricsURL && w.KVEvents.Equal(o.KVEvents) && maps.Equal(w.Labels, o.Labels)
}

// Limits on a worker's labels (a worker block's; pods' labels are
// Kubernetes', which limits them itself: a key is an optional prefix of at
// most 253 characters (a DNS subdomain), "/", and a name of at most 63; a
// value at most 63 characters. Sources: the Kubernetes documentation,
// "Labels and Selectors", section "Syntax and character set"
// (kubernetes.io/docs/concepts/overview/working-with-objects/labels), and
// k8s.io/apimachinery pkg/util/validation (IsQualifiedName,
// IsValidLabelValue)). MaxLabelKeyBytes is that key's most, 253+1+63;
// values here may be longer than a pod's (1 KiB), a worker block not
// being a Kubernetes object.
const (
	MaxLabels          = 64
	MaxLabelKeyBytes   = 317
	MaxLabelValueBytes = 1024
)

// ValidLabel returns nil when key = value may be a label of a worker block:
// key 1 to MaxLabelKeyBytes bytes, value at most MaxLabelValueBytes, both
// UTF-8 without control characters, and key not under shared.LabelPrefix
// ("switchyard.io/", in any case), which the router's own keys use, but
// for shared.LabelClass, the worker's hardware class, which only the
// operator knows.
func ValidLabel(key, value string) error {
	switch {
	case key == "" || len(key) > MaxLabelKeyBytes:
		return fmt.Errorf("label key %q must be 1 to %d bytes", trimmed(key), MaxLabelKeyBytes)
	case len(value) > MaxLabelValueBytes:
		return fmt.Errorf("label %q: value of %d bytes, at most %d", key, len(value), MaxLabelValueBytes)
	case key != shared.LabelClass && len(key) >= len(shared.LabelPrefix) && strings.EqualFold(key[:len(shared.LabelPrefix)], shared.LabelPrefix):
		return fmt.Errorf("label key %q is under %q, which the router sets itself (%s, %s, %s; %s is the one key there a worker block sets)", key, shared.LabelPrefix,
			shared.LabelRole, shared.LabelModel, shared.LabelDPRank, shared.LabelClass)
	case !printable(key):
		return fmt.Errorf("label key %q must be UTF-8 without control characters", key)
	case !printable(value):
		return fmt.Errorf("label %q: the value must be UTF-8 without control characters", key)
	}
	return nil
}

func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

func trimmed(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// KVEvents is a worker's `kv_events` block: where the engine publishes its
// KV-cache events (vLLM's --kv-events-config, SGLang's likewise).
//
//	kv_events {
//	  endpoint        = "tcp://10.0.0.5:5557"  # required: the engine's ZeroMQ PUB socket
//	  topic           = ""                     # default: every topic
//	  replay_endpoint = "tcp://10.0.0.5:5558"  # default "": no replay
//	  snapshot_endpoint = "tcp://10.0.0.5:5559" # default "": no snapshots
//	}
type KVEvents struct {
	// Endpoint is the PUB socket to subscribe to: "tcp://HOST:PORT", a
	// host and a port from 1 to 65535.
	Endpoint string
	// Topic is the subscription's topic prefix; "" subscribes to every
	// topic.
	Topic string
	// ReplayEndpoint is the engine's ROUTER socket that replays events
	// from a sequence number ("tcp://HOST:PORT"); "" when the engine has
	// none.
	ReplayEndpoint string
	// SnapshotEndpoint is the engine's ROUTER socket serving KV-cache
	// snapshots (vLLM's snapshot_endpoint, PR 57789: "tcp://HOST:PORT"),
	// offset by the data-parallel rank like the others; "" when the
	// engine has none.
	SnapshotEndpoint string
	// Range is the block's definition (`kv_events`).
	Range hcl.Range
}

// Equal reports whether k and o are both nil or set the same endpoints and
// topic (their ranges aside).
func (k *KVEvents) Equal(o *KVEvents) bool {
	if k == nil || o == nil {
		return k == o
	}
	return k.Endpoint == o.Endpoint && k.Topic == o.Topic && k.ReplayEndpoint == o.ReplayEndpoint && k.SnapshotEndpoint == o.SnapshotEndpoint
}

var workerSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "url", Required: true},
		{Name: "role"},
		{Name: "models"},
		{Name: "total_kv_blocks"},
		{Name: "metrics_url"},
		{Name: "labels"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "kv_events"}},
}

var kvEventsSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "endpoint", Required: true},
		{Name: "topic"},
		{Name: "replay_endpoint"},
		{Name: "snapshot_endpoint"},
	},
}

// workersFileSchema is the schema of a --workers-file: worker blocks only.
var workersFileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{{Type: blockWorker, LabelNames: []string{"name"}}},
}

// LoadWorkers reads a workers file (`router serve --workers-file`): worker
// blocks only, in the policy file's syntax (native HCL, or HCL's JSON
// syntax when path ends in ".json"); any other block or attribute is an
// error. It returns the workers in file order, or nil and every error found.
// A file without blocks is valid and has no workers. The file must be a
// regular file (symbolic links are followed) of at most
// inputfile.MaxConfigSize bytes (see readFile), nested at most MaxNesting
// deep (see CheckNesting).
func LoadWorkers(path string) ([]Worker, hcl.Diagnostics) {
	src, diags := readFile(path, "workers")
	if diags != nil {
		return nil, diags
	}
	return ParseWorkers(path, src)
}

// ParseWorkers is LoadWorkers of src named filename.
func ParseWorkers(filename string, src []byte) ([]Worker, hcl.Diagnostics) {
	file, diags := parse(filename, src)
	if file == nil || file.Body == nil {
		return nil, diags
	}
	l := newLoader(filename, catalog.New())
	l.diags = diags
	content, diags := file.Body.Content(workersFileSchema)
	l.diags = append(l.diags, diags...)
	for _, blk := range content.Blocks {
		l.workerBlock(blk)
	}
	l.diags = dedupe(l.diags)
	if l.diags.HasErrors() {
		return nil, l.diags
	}
	ws := l.file.Workers
	if ws == nil {
		ws = []Worker{}
	}
	return ws, l.diags
}

// workerBlock decodes one worker block into PolicyFile.Workers; a block with
// an error is left out.
func (l *loader) workerBlock(blk *hcl.Block) {
	name := blk.Labels[0]
	ok := l.checkName("worker", name, blk.LabelRanges[0])
	if first, dup := l.workerAt[name]; ok && dup {
		l.errorf(blk.LabelRanges[0], "Duplicate worker",
			"Worker %q is already declared at %s; rename or remove one of them.", name, pos(first))
		ok = false
	}
	w := Worker{Name: name, Role: shared.RoleAggregated, Range: blk.DefRange, AttrRanges: make(map[string]hcl.Range)}
	errorsBefore := len(l.diags.Errs())
	content, diags := blk.Body.Content(workerSchema)
	l.diags = append(l.diags, diags...)
	for n, attr := range content.Attributes {
		w.AttrRanges[n] = attr.Range
	}
	if attr, found := content.Attributes["url"]; found {
		if s, good := l.stringAttr(attr); good {
			if checked := l.engineURL(attr, s); checked != "" {
				base, err := EngineBaseURL(checked)
				if err != nil {
					l.attrErrorf(attr, "Invalid URL", "The value of %q is refused: %s.", attr.Name, err)
				} else {
					w.URL = base
					if base != s {
						w.GivenURL = s
					}
				}
			}
		}
	}
	if attr, found := content.Attributes["metrics_url"]; found {
		if s, good := l.stringAttr(attr); good && s != "" {
			w.MetricsURL = l.engineURL(attr, s)
		}
	}
	if w.MetricsURL == "" && w.URL != "" {
		w.MetricsURL = w.URL + "/metrics"
	}
	if attr, found := content.Attributes["role"]; found {
		if s, good := l.stringAttr(attr); good {
			if r := shared.Role(s); r.Valid() {
				w.Role = r
			} else {
				l.attrErrorf(attr, "Invalid role", "role must be %q (the default), %q or %q, got %q.",
					shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode, s)
			}
		}
	}
	if attr, found := content.Attributes["models"]; found {
		if v, good := l.nonNull(attr, cty.List(cty.String)); good {
			w.Models = l.models(attr, v)
		}
	}
	if attr, found := content.Attributes["total_kv_blocks"]; found {
		if n, good := l.intAttr(attr); good {
			if n <= 0 || n > 1<<40 {
				l.attrErrorf(attr, "Invalid total_kv_blocks",
					"total_kv_blocks is the worker's KV capacity in router blocks (router.block_size tokens each) and must be between 1 and %d, got %d.",
					int64(1)<<40, n)
			} else {
				w.TotalKVBlocks = n
			}
		}
	}
	if attr, found := content.Attributes["labels"]; found {
		l.duplicateKeys(attr, "label")
		if v, good := l.nonNull(attr, cty.Map(cty.String)); good {
			w.Labels = l.labels(attr, v)
		}
	}
	for _, kb := range content.Blocks {
		if w.KVEvents != nil {
			l.errorf(kb.DefRange, "Duplicate kv_events block",
				"Worker %q already has a kv_events block at %s; a worker has at most one.", name, pos(w.KVEvents.Range))
			continue
		}
		w.KVEvents = l.kvEventsBlock(kb)
	}
	if ok && len(l.diags.Errs()) == errorsBefore {
		l.file.Workers = append(l.file.Workers, w)
		l.workerAt[name] = w.Range
		l.sameURL(&w)
	}
}

// sameURL warns when w, a loaded worker block, has the url of an earlier
// block of the file: one engine declared twice is counted twice (its
// capacity, its requests in flight split across two names), a copy-paste
// mistake more often than not. It is not refused: two names for one engine
// may be deliberate (a test of the router's bookkeeping, an engine given a
// second role), and the router works either way.
func (l *loader) sameURL(w *Worker) {
	first, dup := l.workerURLAt[w.URL]
	if !dup {
		l.workerURLAt[w.URL] = w
		return
	}
	l.diags = append(l.diags, sameURLWarning(w, first))
}

// sameURLWarning is the warning at w that it has the url of first, an
// earlier worker block (of its file or another).
func sameURLWarning(w, first *Worker) *hcl.Diagnostic {
	return &hcl.Diagnostic{
		Severity: hcl.DiagWarning,
		Summary:  "Two workers at one URL",
		Detail: fmt.Sprintf("Worker %q (here) and worker %q (%s) both have url %q: one engine counted as two workers, with two capacities and two bookings. Remove one, or give each its engine's URL.",
			w.Name, first.Name, pos(first.Range), w.URL),
		Subject: w.Range.Ptr(),
	}
}

// SameURLAcross warns, as a file's own blocks are warned about (Load,
// ParseWorkers), at each worker of later whose url (as loaded:
// normalised) is that of a worker of earlier, naming the first such
// worker of earlier and where it is: the policy file's worker blocks
// (earlier) and a workers file's (later) are one membership, so one
// engine declared in both is counted twice. Workers at one url within
// later are its loader's to warn about, not this. Work linear in the
// workers.
func SameURLAcross(earlier, later []Worker) hcl.Diagnostics {
	at := make(map[string]*Worker, len(earlier))
	for i := range earlier {
		if _, ok := at[earlier[i].URL]; !ok {
			at[earlier[i].URL] = &earlier[i]
		}
	}
	var diags hcl.Diagnostics
	for i := range later {
		if first, ok := at[later[i].URL]; ok {
			diags = append(diags, sameURLWarning(&later[i], first))
		}
	}
	return diags
}

// kvEventsBlock decodes a worker's kv_events block; its errors are reported
// at the attribute's file:line:col.
func (l *loader) kvEventsBlock(blk *hcl.Block) *KVEvents {
	k := &KVEvents{Range: blk.DefRange}
	content, diags := blk.Body.Content(kvEventsSchema)
	l.diags = append(l.diags, diags...)
	if attr, found := content.Attributes["endpoint"]; found {
		if s, good := l.stringAttr(attr); good {
			k.Endpoint = l.zmqEndpoint(attr, s)
		}
	}
	if attr, found := content.Attributes["topic"]; found {
		if s, good := l.stringAttr(attr); good {
			k.Topic = s
		}
	}
	if attr, found := content.Attributes["replay_endpoint"]; found {
		if s, good := l.stringAttr(attr); good && s != "" {
			k.ReplayEndpoint = l.zmqEndpoint(attr, s)
		}
	}
	if attr, found := content.Attributes["snapshot_endpoint"]; found {
		if s, good := l.stringAttr(attr); good && s != "" {
			k.SnapshotEndpoint = l.zmqEndpoint(attr, s)
		}
	}
	return k
}

// zmqEndpoint checks a ZeroMQ endpoint attribute, "tcp://HOST:PORT", and
// returns it ("" after reporting an error).
func (l *loader) zmqEndpoint(attr *hcl.Attribute, s string) string {
	const example = "\"tcp://127.0.0.1:5557\""
	rest, found := strings.CutPrefix(s, "tcp://")
	if !found {
		l.attrErrorf(attr, "Invalid endpoint", "The value of %q must be a ZeroMQ TCP endpoint such as %s, got %q.", attr.Name, example, s)
		return ""
	}
	host, port, err := net.SplitHostPort(rest)
	switch {
	case err != nil || strings.ContainsAny(rest, "/?#@"):
		l.attrErrorf(attr, "Invalid endpoint", "The value of %q must be \"tcp://HOST:PORT\", such as %s, got %q.", attr.Name, example, s)
	case host == "" || host == "*":
		l.attrErrorf(attr, "Invalid endpoint", "The value of %q must name the engine's host, as in %s, got %q.", attr.Name, example, s)
	case port == "" || !validPort(port):
		l.attrErrorf(attr, "Invalid endpoint", "The port of %q must be a number from 1 to 65535, got %q.", attr.Name, port)
	default:
		return s
	}
	return ""
}

// engineURL checks an engine URL attribute and returns it ("" after
// reporting an error).
func (l *loader) engineURL(attr *hcl.Attribute, s string) string {
	u, err := url.Parse(s)
	switch {
	case !strings.Contains(s, "://"):
		// "127.0.0.1:8001" fails to parse and "localhost:8001" parses
		// with scheme "localhost": say what both lack.
		l.attrErrorf(attr, "Invalid URL", "The value of %q has no scheme: want http://HOST:PORT (add \"http://\": %q).",
			attr.Name, "http://"+redactHostPort(s))
	case err != nil:
		l.attrErrorf(attr, "Invalid URL", "The value of %q must be an http or https URL such as \"http://127.0.0.1:8001\": %v.", attr.Name, redactErr(err))
	case u.Scheme != "http" && u.Scheme != "https":
		l.attrErrorf(attr, "Invalid URL", "The value of %q must be an http or https URL such as \"http://127.0.0.1:8001\", got scheme %q.", attr.Name, u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		l.attrErrorf(attr, "Invalid URL", "The value of %q must name a host, as in \"http://127.0.0.1:8001\", got %q.", attr.Name, u.Redacted())
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		// Redacted: never echo a password from the file into logs.
		l.attrErrorf(attr, "Invalid URL", "The value of %q must have no user, query or fragment, got %q.", attr.Name, u.Redacted())
	case !validPort(u.Port()):
		l.attrErrorf(attr, "Invalid URL", "The port of %q must be a number from 1 to 65535, got %q.", attr.Name, u.Port())
	default:
		return s
	}
	return ""
}

// EngineBaseURL returns u, an http(s) URL, as an engine's base URL: the
// URL the router appends its endpoints' paths to (/v1/chat/completions,
// /v1/completions, /v1/models, /tokenize, /health, /metrics,
// /kv_event_sources, /server_info). A trailing "/" is dropped, and so is a
// last path segment "v1" (any case; "/v1" and "/v1/"), which OpenAI
// clients take as part of a base URL but which would make every request
// go to /v1/v1/...; a path prefix in front of the engine (a reverse
// proxy's "/engines/a") is kept. It refuses, with an error saying why, a
// path that names one of those endpoints (one with a "v1" segment before
// its end, such as "/v1/chat/completions", or ending in "metrics",
// "health", "tokenize", "kv_event_sources", "server_info" or
// "get_server_info"), and one that is not clean (an empty, "." or ".."
// segment). u's scheme, host, port and escaping are kept as written.
func EngineBaseURL(u string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	base := strings.TrimRight(u, "/")
	path := strings.TrimRight(pu.Path, "/")
	if i := strings.LastIndexByte(path, '/'); i >= 0 && strings.EqualFold(path[i+1:], "v1") &&
		len(base) >= len("/v1") && strings.EqualFold(base[len(base)-len("/v1"):], "/v1") {
		path = path[:i]
		base = base[:len(base)-len("/v1")]
		if strings.HasSuffix(base, "/") {
			return "", fmt.Errorf("the path of url %q is not clean (an empty segment); write the engine's base URL, such as \"http://10.0.0.5:8000\"", pu.Redacted())
		}
	}
	if path == "" {
		return base, nil
	}
	segs := strings.Split(path[1:], "/")
	for i, seg := range segs {
		switch {
		case seg == "" || seg == "." || seg == "..":
			return "", fmt.Errorf("the path of url %q is not clean (an empty, \".\" or \"..\" segment); write the engine's base URL, such as \"http://10.0.0.5:8000\", or a reverse proxy's path prefix in front of it", pu.Redacted())
		case strings.EqualFold(seg, "v1"), i == len(segs)-1 && slices.Contains(endpointPaths, strings.ToLower(seg)):
			return "", fmt.Errorf("url %q names an endpoint (path %q), not the engine's base URL: the router appends /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /health and /metrics itself; write the base URL, such as \"http://10.0.0.5:8000\" (a trailing \"/v1\" is dropped)", pu.Redacted(), pu.Path)
		}
	}
	return base, nil
}

// endpointPaths are the last path segments EngineBaseURL refuses: the
// engine endpoints the router appends to the base URL.
var endpointPaths = []string{"metrics", "health", "tokenize", "kv_event_sources", "server_info", "get_server_info"}

// validPort reports whether p is empty (the scheme's default) or a port
// number from 1 to 65535.
func validPort(p string) bool {
	if p == "" {
		return true
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// redactHostPort is s, a URL written without a scheme, with any user
// information before an '@' dropped, so a password in the file is never
// echoed.
func redactHostPort(s string) string {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// redactErr hides the user information of the URL a *url.Error names.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			return &url.Error{Op: ue.Op, URL: u.Redacted(), Err: ue.Err}
		}
		return ue.Err
	}
	return err
}

// models checks the models list: at least one name, each non-empty and
// listed once.
// labels checks a worker's labels map (ValidLabel, at most MaxLabels) and
// returns it; nil for an empty map or after reporting an error at the
// attribute's file:line:col.
func (l *loader) labels(attr *hcl.Attribute, v cty.Value) map[string]string {
	if v.LengthInt() > MaxLabels {
		l.attrErrorf(attr, "Invalid labels", "A worker has at most %d labels, got %d.", MaxLabels, v.LengthInt())
		return nil
	}
	out := make(map[string]string, v.LengthInt())
	for k, e := range v.AsValueMap() {
		if e.IsNull() {
			l.attrErrorf(attr, "Invalid labels", "Label %q is null; a label's value is a string (\"\" for none).", k)
			return nil
		}
		if err := ValidLabel(k, e.AsString()); err != nil {
			l.attrErrorf(attr, "Invalid labels", "%s.", capitalize(err.Error()))
			return nil
		}
		out[k] = e.AsString()
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (l *loader) models(attr *hcl.Attribute, v cty.Value) []string {
	var out []string
	for _, e := range v.AsValueSlice() {
		switch {
		case e.IsNull() || strings.TrimSpace(e.AsString()) == "":
			l.attrErrorf(attr, "Invalid models", "models must list the model names the worker serves, as non-empty strings.")
			return nil
		case slices.Contains(out, e.AsString()):
			l.attrErrorf(attr, "Invalid models", "Model %q is listed twice.", e.AsString())
			return nil
		}
		out = append(out, e.AsString())
	}
	if len(out) == 0 {
		l.attrErrorf(attr, "Invalid models", "models must list at least one model the worker serves, for example [\"llama\"].")
	}
	return out
}
