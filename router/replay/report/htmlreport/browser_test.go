package htmlreport

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/switchyard-router/switchyard/router/replay/report"
)

// browser is the path of a Chromium or Chrome on PATH. Without one the
// test fails when SWITCHYARD_REQUIRE_BROWSER=1 (make test sets it, after
// installing Debian's chromium), and is skipped otherwise.
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("SWITCHYARD_REQUIRE_BROWSER") == "1" {
		t.Fatal("no chromium, chromium-browser or google-chrome on PATH, and SWITCHYARD_REQUIRE_BROWSER=1 (make browser-deps installs Debian's chromium)")
	}
	t.Skip("no chromium, chromium-browser or google-chrome on PATH (make browser-deps installs it)")
	return ""
}

// artifacts is the directory the test keeps its screenshot and page in:
// $SWITCHYARD_ARTIFACTS, or else a temporary directory.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SWITCHYARD_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// figureInfo is what the page's script reads of one figure's chart.
type figureInfo struct {
	Title string  // the chart's first text (its title)
	Width float64 // the drawn size, in CSS pixels
	Texts []string
	// Data is the chart's paths in a series' color (not the black,
	// gray and white of axes, grid and background) of two or more
	// segments: lines, bands and glyphs, not the legend's line samples.
	Data int
}

// The report of a real sweep (two policies, two fleets, two seeds; the
// larger fleet over MaxWorkerLines) opens in headless Chromium from a
// file: with no console message of error or warning level, no exception,
// no request but the page's own, and every chart drawn with data, its
// title and its axis labels. The screenshot and the page are kept.
func TestReportInChromium(t *testing.T) {
	path := browser(t)
	cells := mustCells(t)
	dir := artifacts(t)
	var page bytes.Buffer
	in := Input{Title: "browser test", Trace: "mooncake_arxiv_trace_first1000.jsonl", Requests: fixtureRequests, Cells: cells,
		Comparison: report.Comparison{Baseline: "power-of-two"}, SLO: fixtureSLO.String(), Command: "router replay --html report.html"}
	if err := Write(&page, in); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "replay-report.html")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("page: %s (%d bytes)", file, page.Len())

	// No sandbox: CI runs as root in a container, where Chromium's sandbox
	// cannot start. The defaults are headless, with --disable-dev-shm-usage.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000))
	// The machine may be loaded: generous bounds, on the whole browser and
	// on each step, never an assertion of speed.
	whole, cancelWhole := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelWhole()
	actx, cancelAlloc := chromedp.NewExecAllocator(whole, opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	step := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if _, err := chromedp.Run(sctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// Start the browser before subscribing (Listen needs its tab), on the
	// context without a step's timeout: the browser lives as long as the
	// context of the first Run.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}

	var (
		mu       sync.Mutex
		problems []string
		requests []string
	)
	err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning ||
				e.Type == runtime.ConsoleAPICalledTypeAssert {
				problems = append(problems, fmt.Sprintf("console %s", e.Type))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError || e.Entry.Level == log.EntryLevelWarning {
				problems = append(problems, fmt.Sprintf("log %s (%s): %s", e.Entry.Level, e.Entry.Source, e.Entry.Text))
			}
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	pageURL := (&url.URL{Scheme: "file", Path: file}).String()
	step("open "+pageURL, chromedp.Navigate(pageURL))
	var layout struct {
		Headings []string
		Best     int // best cells marked in bold with a star
		Closed   int // collapsed charts
	}
	step("read the layout", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		layout, err = chromedp.Evaluate[struct {
			Headings []string
			Best     int
			Closed   int
		}](`({Headings: [...document.querySelectorAll("h2")].map(h => h.id),
  Best: [...document.querySelectorAll("#comparison-table td.best")].filter(td => td.querySelector("strong") && td.textContent.includes("★")).length,
  Closed: [...document.querySelectorAll("details")].filter(d => !d.open).length})`)(ctx, target)
		return chromedp.Void{}, err
	})
	if len(layout.Headings) < 2 || layout.Headings[0] != "verdict" || layout.Headings[1] != "comparison" {
		t.Errorf("headings %q: want the verdict first, then the comparison", layout.Headings)
	}
	if layout.Best == 0 {
		t.Error("no table cell marked best (bold and ★)")
	}
	// Open the collapsed charts, so that every chart is measured drawn.
	step("open the collapsed charts", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[int](`document.querySelectorAll("details").forEach(d => d.open = true), 0`)(ctx, target)
		return chromedp.Void{}, err
	})

	var figures []figureInfo
	step("read the charts", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		figures, err = chromedp.Evaluate[[]figureInfo](`[...document.querySelectorAll("figure")].map(f => {
  const svg = f.querySelector("svg");
  if (!svg) return {Title: "", Width: 0, Texts: [], Data: 0};
  const texts = [...svg.querySelectorAll("text")].map(t => t.textContent);
  const colored = p => ((p.getAttribute("style") || "").match(/#[0-9A-Fa-f]{6}/g) || []).some(c => !["#000000", "#808080", "#FFFFFF"].includes(c.toUpperCase()));
  const segments = p => ((p.getAttribute("d") || "").match(/[LACQ]/g) || []).length;
  const data = [...svg.querySelectorAll("path")].filter(p => colored(p) && segments(p) >= 2).length;
  return {Title: texts[0] || "", Width: svg.getBoundingClientRect().width, Texts: texts, Data: data};
})`)(ctx, target)
		return chromedp.Void{}, err
	})
	var rows int
	step("count the table's rows", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		rows, err = chromedp.Evaluate[int](`document.querySelectorAll("#comparison-table tbody tr").length`)(ctx, target)
		return chromedp.Void{}, err
	})
	var shot []byte
	step("screenshot", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		shot, err = chromedp.FullScreenshot(100)(ctx, target)
		return chromedp.Void{}, err
	})
	png := filepath.Join(dir, "replay-report.png")
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", png)

	// The documentation's images: the verdict and table, and the
	// in-flight bands of the fleet over MaxWorkerLines.
	images := os.Getenv("SWITCHYARD_REPORT_IMAGES")
	if images == "" {
		images = dir
	}
	for _, shot := range []struct{ name, sel string }{
		{"report-verdict.png", `#decide`},
		{"report-in-flight.png", fmt.Sprintf(`//figure[contains(string(.), "default, %d workers: requests in flight")]`, fixtureFleets[1])},
	} {
		var png []byte
		step("screenshot "+shot.sel, func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
			var err error
			png, err = chromedp.Screenshot(chromedp.Search(shot.sel))(ctx, target)
			return chromedp.Void{}, err
		})
		if err := os.WriteFile(filepath.Join(images, shot.name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// At a 900 px viewport the page does not overflow sideways: the
	// tables scroll inside their containers, whose right edge is on
	// screen, with the policy column kept in view.
	step("a 900 px viewport", chromedp.EmulateViewport(900, 1000))
	var narrow struct {
		Page, View, Right float64
		Overflow, Sticky  string
	}
	step("measure at 900 px", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		narrow, err = chromedp.Evaluate[struct {
			Page, View, Right float64
			Overflow, Sticky  string
		}](`(() => { const wrap = document.querySelector("#comparison-table").parentElement;
  return {Page: document.documentElement.scrollWidth, View: window.innerWidth, Right: wrap.getBoundingClientRect().right,
    Overflow: getComputedStyle(wrap).overflowX, Sticky: getComputedStyle(document.querySelector("#comparison-table td.label")).position}; })()`)(ctx, target)
		return chromedp.Void{}, err
	})
	if narrow.View != 900 || narrow.Page > narrow.View || narrow.Right > narrow.View || narrow.Overflow != "auto" || narrow.Sticky != "sticky" {
		t.Errorf("at 900 px: %+v; want a page no wider than the viewport, the table scrolling in a container on screen, the policy column sticky", narrow)
	}
	// The verdict reads at 900 px without any scroll sideways: every
	// cell of it is within the viewport, and no box of it scrolls.
	var verdict struct {
		Cells     int
		Outside   []string // the cells not wholly within the viewport
		Scrolling []string // the boxes whose content is wider than they are
	}
	step("measure the verdict at 900 px", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		verdict, err = chromedp.Evaluate[struct {
			Cells     int
			Outside   []string
			Scrolling []string
		}](`(() => { const cells = [...document.querySelectorAll("#decide table.decision th, #decide table.decision td")];
  const name = e => e.tagName + "." + e.className + " " + e.textContent.slice(0, 40);
  return {Cells: cells.length,
    Outside: cells.filter(c => { const r = c.getBoundingClientRect(); return r.left < 0 || r.right > window.innerWidth; }).map(name),
    Scrolling: [...document.querySelectorAll("#decide .verdicts, #decide .verdicts *")].filter(e => e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0).map(name)}; })()`)(ctx, target)
		return chromedp.Void{}, err
	})
	// Two fleets of the verdict's metrics: a heading and at least the four
	// latency and cache rows (header and value cells) each.
	if verdict.Cells < 2*(1+4*2) || len(verdict.Outside) != 0 || len(verdict.Scrolling) != 0 {
		t.Errorf("the verdict at 900 px: %d cells, outside the viewport %q, boxes wider inside %q; want every cell within the viewport and no box scrolling",
			verdict.Cells, verdict.Outside, verdict.Scrolling)
	}
	var small []byte
	step("screenshot at 900 px", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		var err error
		small, err = chromedp.CaptureScreenshot()(ctx, target)
		return chromedp.Void{}, err
	})
	if err := os.WriteFile(filepath.Join(images, "report-900px.png"), small, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("images: %s", images)

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page logged %d problems: %s", len(problems), strings.Join(problems, "; "))
	}
	if len(requests) != 1 || requests[0] != pageURL {
		t.Errorf("requests %q; want only the page's own, %s", requests, pageURL)
	}
	if rows != len(cells) {
		t.Errorf("table of %d rows, want %d (one per cell)", rows, len(cells))
	}
	// Per fleet: two CDFs and three charts per cell (in flight, queue, KV
	// hit); then the eight sweep metrics (goodput has a value: an SLO).
	want := len(fixtureFleets)*2 + len(cells)*3 + len(sweepMetrics)
	if len(figures) != want {
		t.Fatalf("%d figures, want %d", len(figures), want)
	}
	titles := map[string]bool{}
	for i, f := range figures {
		if f.Data == 0 || f.Width < 100 {
			t.Errorf("figure %d %q: %d data paths, %.0f px wide; want a drawn chart", i, f.Title, f.Data, f.Width)
		}
		if f.Title == "" || titles[f.Title] {
			t.Errorf("figure %d: title %q, empty or repeated", i, f.Title)
		}
		titles[f.Title] = true
		// An axis label with its unit: "TTFT p90 (ms)", or a header that
		// ends with it, "out tok/s" (never "out tok/s (tok/s)").
		if slices.ContainsFunc(f.Texts, func(s string) bool { return strings.HasSuffix(s, "tok/s (tok/s)") }) ||
			!slices.ContainsFunc(f.Texts, func(s string) bool {
				return strings.HasSuffix(s, ")") && strings.Contains(s, " (") || s == "out tok/s"
			}) {
			t.Errorf("figure %d %q: no axis label with its unit in its texts %q", i, f.Title, f.Texts)
		}
	}
}
