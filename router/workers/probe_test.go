package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/switchyard-router/switchyard/internal/testkit"
	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

// every is the scrape interval, so also the probe timeout, of these
// tests: long enough that a loopback answer is rarely late on a loaded
// machine. A probe that does time out is a failure of another reason, so
// the checks of what is logged allow for it (reasonsLogged).
const every = 250 * time.Millisecond

// infoManager is a Manager whose logs, at the default level of `router
// serve` (info), go to the returned buffer.
func infoManager(t *testing.T, o Options) (*Manager, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	o.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	m, _ := newManager(t, newRouter(t), o)
	return m, logs
}

// logLines returns the log lines of message msg about the worker named
// name (every message logs the worker first).
func logLines(logs *syncBuffer, msg, name string) []string {
	var out []string
	key := " " + msg + ": worker=" + name
	for l := range strings.Lines(logs.String()) {
		if _, rest, ok := strings.Cut(l, key); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\n') {
			out = append(out, l)
		}
	}
	return out
}

// reasonsLogged checks the worker's "worker probe failed" lines: the
// first is its first failure, each gives the reason want (or a timeout,
// which a late answer on a loaded machine may cause), and want is logged
// again only after another reason came between: a repeated failure is not
// logged.
func reasonsLogged(t *testing.T, logs *syncBuffer, name, want string) {
	t.Helper()
	lines := logLines(logs, "worker probe failed", name)
	if len(lines) == 0 {
		t.Errorf("%s: no probe failure logged, want reason %q:\n%s", name, want, logs)
		return
	}
	if !strings.Contains(lines[0], "consecutive_failures=1") {
		t.Errorf("%s: first line %q is not the first failure", name, lines[0])
	}
	wanted, other := 0, 0
	prev := ""
	for _, l := range lines {
		_, reason, _ := strings.Cut(l, ` reason="`)
		reason, _, _ = strings.Cut(reason, `" `)
		if !strings.Contains(l, "[INFO]") {
			t.Errorf("%s: not at info: %q", name, l)
		}
		if reason == prev {
			t.Errorf("%s: the same failure logged twice in a row: %q", name, l)
		}
		prev = reason
		switch {
		case strings.HasPrefix(reason, want):
			wanted++
		case strings.HasPrefix(reason, "timeout: "):
			other++
		default:
			t.Errorf("%s: logged %q, want reason %q", name, l, want)
		}
	}
	if wanted == 0 || wanted > other+1 {
		t.Errorf("%s: reason %q logged %d times with %d other reasons between, want once after each:\n%s",
			name, want, wanted, other, strings.Join(lines, ""))
	}
}

// failures returns a condition that holds once the worker named name has
// failed n consecutive probes.
func failures(m *Manager, name string, n int) func() bool {
	return func() bool {
		st, _ := m.StatusOf(name)
		return st.ScrapeFailures >= n
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestProbeFailuresLogged: each way a probe fails is logged at info with
// its reason in plain words, once however often it repeats, and is the
// worker's Status.Reason; the worker is not ready.
func TestProbeFailuresLogged(t *testing.T) {
	m, logs := infoManager(t, Options{ScrapeInterval: every})
	refusedURL := "http://" + closedAddr(t)
	h500 := newEngine(t, vllmMetrics) // no metrics, /health 500
	h500.noMetrics.Store(true)
	h500.healthCode.Store(http.StatusInternalServerError)
	m500 := newEngine(t, vllmMetrics) // /metrics 500
	m500.failing.Store(true)
	garbage := newEngine(t, "vllm:num_requests_waiting{ 7\n")
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers within the scrape interval
	}))
	t.Cleanup(slow.Close)

	refused := config.Worker{Name: "refused", URL: refusedURL, MetricsURL: refusedURL + "/metrics",
		Role: shared.RoleAggregated, Models: []string{"m"}, TotalKVBlocks: 100}
	timeout := refused
	timeout.Name, timeout.URL, timeout.MetricsURL = "slow", slow.URL, slow.URL+"/metrics"
	if err := m.Sync([]config.Worker{refused, timeout, worker("h500", h500, "m"), worker("m500", m500, "m"),
		worker("garbage", garbage, "m")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		is     func(error) bool
		reason string
	}{
		{"refused", func(err error) bool { return errors.Is(err, ErrRefused) },
			"connection refused by " + refusedURL + "/metrics"},
		{"h500", func(err error) bool {
			var se *StatusError
			return errors.As(err, &se) && se.Code == 500 && se.URL == h500.srv.URL+"/health"
		}, fmt.Sprintf("HTTP status 500 from %s/health (and %s/metrics answers 404)", h500.srv.URL, h500.srv.URL)},
		{"m500", func(err error) bool {
			var se *StatusError
			return errors.As(err, &se) && se.Code == 500
		}, fmt.Sprintf("HTTP status 500 from %s/metrics", m500.srv.URL)},
		{"garbage", func(err error) bool { return errors.Is(err, ErrUnparseable) },
			"metrics unparseable from " + garbage.srv.URL + "/metrics: "},
		{"slow", func(err error) bool { return errors.Is(err, ErrTimeout) },
			fmt.Sprintf("timeout: no answer from %s/metrics within %s", slow.URL, every)},
	} {
		// Four failures: the first is logged, the repeats are not.
		testkit.Eventually(t, c.name+" failing 4 times", failures(m, c.name, 4))
		testkit.Eventually(t, c.name+"'s reason", func() bool {
			st, _ := m.StatusOf(c.name)
			return c.is(st.LastError)
		})
		st, _ := m.StatusOf(c.name)
		if st.Ready || !strings.HasPrefix(st.Reason, c.reason) || st.Reason != st.LastError.Error() {
			t.Errorf("%s: ready %v, error %v, reason %q; want not ready, reason %q", c.name, st.Ready, st.LastError, st.Reason, c.reason)
		}
		reasonsLogged(t, logs, c.name, c.reason)
		for _, l := range logLines(logs, "worker probe failed", c.name) {
			if !strings.Contains(l, "ready=false") {
				t.Errorf("%s: %q", c.name, l)
			}
		}
	}
	if anyReady(m) || strings.Contains(logs.String(), "worker ready") {
		t.Errorf("a failing worker became ready:\n%s", logs)
	}
}

// TestReadinessChangesLoggedOnce: a worker's readiness changes are logged
// once each, not at every probe; a failure for another reason is logged
// again, a repeat is not.
func TestReadinessChangesLoggedOnce(t *testing.T) {
	m, logs := infoManager(t, Options{ScrapeInterval: every})
	a := newEngine(t, vllmMetrics)
	if err := m.Sync([]config.Worker{worker("a", a, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a ready", func() bool { return anyReady(m) })
	testkit.Eventually(t, "a probed 4 times", func() bool { return a.scrapes.Load() >= 4 })
	if n := len(logLines(logs, "worker ready", "a")); n != 1 {
		t.Fatalf("%d 'worker ready' lines after 4 probes, want 1:\n%s", n, logs)
	}
	if st, _ := m.StatusOf("a"); st.Reason != "" {
		t.Errorf("ready a with a load has reason %q", st.Reason)
	}

	a.failing.Store(true)
	before := len(logLines(logs, "worker probe failed", "a")) // late answers while ready
	testkit.Eventually(t, "a failing past the threshold", failures(m, "a", DefaultFailureThreshold+3))
	notReady := logLines(logs, "worker not ready", "a")
	if len(notReady) != 1 || !strings.Contains(notReady[0], fmt.Sprintf(`consecutive probes failed: HTTP status 500 from %s/metrics"`, a.srv.URL)) {
		t.Errorf("'worker not ready' lines %q, want one with the reason", notReady)
	}
	failed := logLines(logs, "worker probe failed", "a")[before:]
	if len(failed) == 0 || !strings.Contains(failed[0], "HTTP status 500") || !strings.Contains(failed[0], "ready=true") {
		t.Fatalf("probe failures logged %q, want the first 500 while a was ready", failed)
	}
	if n := strings.Count(strings.Join(failed, ""), "HTTP status 500"); n > 1+strings.Count(strings.Join(failed, ""), "timeout: ") {
		t.Errorf("the 500 logged %d times, not only after other reasons:\n%s", n, strings.Join(failed, ""))
	}

	// Another reason is logged; its repeats are not.
	a.noMetrics.Store(true)
	a.healthCode.Store(http.StatusServiceUnavailable)
	testkit.Eventually(t, "the new reason", func() bool {
		st, _ := m.StatusOf("a")
		return strings.HasPrefix(st.Reason, "HTTP status 503 from "+a.srv.URL+"/health")
	})
	n := a.healths.Load()
	testkit.Eventually(t, "3 more probes", func() bool { return a.healths.Load() >= n+3 })
	var got503 []string
	for _, l := range logLines(logs, "worker probe failed", "a") {
		if strings.Contains(l, "HTTP status 503") {
			got503 = append(got503, l)
		}
	}
	if len(got503) == 0 || !strings.Contains(got503[0], "ready=false") || len(got503) > 1+strings.Count(logs.String(), "worker=a reason=\"timeout: ") {
		t.Errorf("the 503 logged as %q, want once (and again only after a timeout)", got503)
	}

	a.failing.Store(false)
	a.noMetrics.Store(false)
	// A /health answering 503 keeps a worker out whatever its metrics
	// say (a draining engine): it is back once both answer.
	a.healthCode.Store(http.StatusOK)
	testkit.Eventually(t, "a back", func() bool { return anyReady(m) })
	n = a.scrapes.Load()
	testkit.Eventually(t, "3 more probes", func() bool { return a.scrapes.Load() >= n+3 })
	if r, nr := logLines(logs, "worker ready", "a"), logLines(logs, "worker not ready", "a"); len(r) != 2 || len(nr) != 1 {
		t.Errorf("%d ready and %d not-ready lines, want 2 and 1:\n%s", len(r), len(nr), logs)
	}
}

// TestMetrics404IsReadyByHealth: a worker whose metrics endpoint answers
// 404 (SGLang without --enable-metrics) is ready while /health answers,
// with LOAD unavailable (not idle), a reason saying so, and one warning
// however many probes; a vLLM worker beside it keeps its load. Once its
// metrics appear its load is known again.
func TestMetrics404IsReadyByHealth(t *testing.T) {
	m, logs := infoManager(t, Options{ScrapeInterval: every})
	r := m.r.(*router.Router)
	sgl, v := newEngine(t, sglangMetrics), newEngine(t, vllmMetrics)
	sgl.noMetrics.Store(true)
	if err := m.Sync([]config.Worker{worker("sgl", sgl, "m"), worker("v", v, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "both ready", membersAre(r, "m", shared.RoleAggregated, "sgl", "v"))
	testkit.Eventually(t, "sgl probed 4 times", func() bool { return sgl.healths.Load() >= 4 })
	if l := member(r, "sgl").Load(false); l.Available || l.HasKVUsage || l.HasWaiting {
		t.Errorf("sgl load %+v, want unavailable", l)
	}
	if l := member(r, "v").Load(false); !l.Available || l.KVUsage != 0.42 {
		t.Errorf("v load %+v, want vLLM's report", l)
	}
	st, _ := m.StatusOf("sgl")
	want := fmt.Sprintf("%s/metrics answers 404 (SGLang serves metrics only with --enable-metrics); ready by %s/health", sgl.srv.URL, sgl.srv.URL)
	if !st.Ready || st.Load != nil || st.LastError != nil || st.Reason != want {
		t.Errorf("sgl status: ready %v, load %v, error %v, reason %q; want ready, no load, reason %q", st.Ready, st.Load, st.LastError, st.Reason, want)
	}
	warned := logLines(logs, "worker engine load unknown: LOAD is unavailable, not idle", "sgl")
	if len(warned) != 1 || !strings.Contains(warned[0], "[WARN]") || !strings.Contains(warned[0], want) {
		t.Errorf("warnings %q, want one naming the 404", warned)
	}
	if n := len(logLines(logs, "worker ready", "sgl")); n != 1 {
		t.Errorf("%d 'worker ready' lines, want 1", n)
	}
	if len(logLines(logs, "worker engine load unknown: LOAD is unavailable, not idle", "v")) != 0 {
		t.Errorf("the vLLM worker's load was called unknown:\n%s", logs)
	}

	sgl.noMetrics.Store(false)
	testkit.Eventually(t, "sgl's load", func() bool { return member(r, "sgl").Load(false).Available })
	if l := member(r, "sgl").Load(false); l.KVUsage != 0.25 || l.Waiting != 2 {
		t.Errorf("sgl load %+v, want its metrics", l)
	}
	if st, _ := m.StatusOf("sgl"); st.Reason != "" {
		t.Errorf("reason %q with its load known", st.Reason)
	}
	if n := len(logLines(logs, "worker engine load known again", "sgl")); n != 1 {
		t.Errorf("%d 'known again' lines, want 1:\n%s", n, logs)
	}
}

// TestReasonIsBounded: an engine's long parse error is clipped in the
// reason.
func TestReasonIsBounded(t *testing.T) {
	m, _ := infoManager(t, Options{ScrapeInterval: every})
	e := newEngine(t, "vllm:num_requests_waiting "+strings.Repeat("x", 10000)+"\n")
	if err := m.Sync([]config.Worker{worker("e", e, "m")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a parse failure", func() bool {
		st, _ := m.StatusOf("e")
		return errors.Is(st.LastError, ErrUnparseable)
	})
	st, _ := m.StatusOf("e")
	if !errors.Is(st.LastError, ErrUnparseable) || len(st.Reason) > len(e.srv.URL)+100+maxReasonBytes {
		t.Errorf("reason of %d bytes: %.300q", len(st.Reason), st.Reason)
	}
}

// TestScrapeTooLarge: a metrics answer over maxMetricsBytes fails the
// probe as too large, saying so, whether its first 16 MiB parse (many
// series, the load at the end) or not (one huge label). It was a parse
// error ("unexpected end of input stream") or a report without the load
// the cut-off lines held.
func TestScrapeTooLarge(t *testing.T) {
	series := strings.Repeat("vllm:num_requests_running{engine=\"0\"} 1\n", maxMetricsBytes/40+1) + vllmMetrics
	label := "vllm:num_requests_waiting{a=\"" + strings.Repeat("x", maxMetricsBytes) + "\"} 1\n"
	for name, body := range map[string]string{"many series": series, "one huge label": label} {
		t.Run(name, func(t *testing.T) {
			e := newEngine(t, body)
			_, err := scrape(context.Background(), &http.Client{}, e.srv.URL+"/metrics", time.Minute)
			want := "metrics too large: the answer of " + e.srv.URL + "/metrics is over 16 MiB"
			if !errors.Is(err, ErrTooLarge) || err.Error() != want {
				t.Errorf("scrape = %v, want %s", err, want)
			}
		})
	}
	// At the limit exactly: parsed.
	fill := "# " + strings.Repeat("x", maxMetricsBytes-len(vllmMetrics)-3) + "\n"
	e := newEngine(t, fill+vllmMetrics)
	rep, err := scrape(context.Background(), &http.Client{}, e.srv.URL+"/metrics", time.Minute)
	if err != nil || !rep.HasLoad() {
		t.Errorf("scrape of %d bytes = %+v, %v; want its load", len(fill+vllmMetrics), rep, err)
	}
}

// TestHealth503TakesAWorkerOut: an engine whose metrics answer but whose
// /health answers 503 (a draining vLLM) leaves the candidate set with the
// reason; a /health that answers 404 (an engine without one) changes
// nothing; the worker is back once /health answers 200.
func TestHealth503TakesAWorkerOut(t *testing.T) {
	m, _ := infoManager(t, Options{ScrapeInterval: every})
	draining := newEngine(t, vllmMetrics)
	noHealth := newEngine(t, vllmMetrics)
	noHealth.healthCode.Store(http.StatusNotFound)
	if err := m.Sync([]config.Worker{worker("draining", draining, "m"), worker("nohealth", noHealth, "m")}); err != nil {
		t.Fatal(err)
	}
	ready := func(name string) func() bool {
		return func() bool { st, _ := m.StatusOf(name); return st.Ready }
	}
	testkit.Eventually(t, "both ready", func() bool { return ready("draining")() && ready("nohealth")() })
	draining.healthCode.Store(http.StatusServiceUnavailable)
	testkit.Eventually(t, "draining out", func() bool { return !ready("draining")() })
	st, _ := m.StatusOf("draining")
	if want := "not serving: " + draining.srv.URL + "/health answers 503 (the engine is draining or dead)"; !strings.Contains(st.Reason, want) {
		t.Errorf("reason %q, want it to say %q", st.Reason, want)
	}
	if !ready("nohealth")() {
		t.Error("a worker whose /health answers 404 left")
	}
	draining.healthCode.Store(http.StatusOK)
	testkit.Eventually(t, "draining back", ready("draining"))
}
