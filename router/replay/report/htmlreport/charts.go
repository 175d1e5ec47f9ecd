package htmlreport

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/switchyard-router/switchyard/router/replay/report"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// chart is one plot: lines (with optional error bars) and bands, drawn by
// gonum/plot as SVG with its legend right of the plot area, so the legend
// never hides data.
type chart struct {
	title, xLabel, yLabel string
	// logX draws the x axis in log scale (every x must be > 0).
	logX bool
	// xMax and yMax, when not NaN, fix the axes' upper ends (so charts of
	// one fleet share a scale); the lower ends are 0 (logX: the data's).
	xMax, yMax float64
	// xTicks, when set, are the x axis's ticks (a sweep's fleets).
	xTicks []plot.Tick
	series []series
	// note, when set, is shown under the chart (what it leaves out).
	note string
}

// series is one legend entry: a line, or a filled band between two
// lines.
type series struct {
	name   string
	xys    plotter.XYs
	color  color.Color
	dashes []vg.Length
	// width is the line's width in points; 0 for the default, 1.2.
	width vg.Length
	// points marks each point (sweeps, whose x values are few).
	points bool
	// errs, when set, are error bars below and above each point.
	errs plotter.YErrors
	// lo and hi, when set in place of xys, bound a filled band.
	lo, hi plotter.XYs
}

// The chart size, in points; the page scales it to its column's width.
const (
	chartW = 400
	chartH = 250
)

// sans is the charts' font: Liberation Sans, metric-compatible with
// Arial and Helvetica, which the page's style falls back to (nothing is
// embedded or fetched).
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// svg draws c and returns its SVG element.
func (c chart) svg() (string, error) {
	p := plot.New()
	p.Title.Text = c.title
	p.Title.TextStyle.Font = font.From(sans, 13)
	p.X.Label.Text, p.Y.Label.Text = c.xLabel, c.yLabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 11)
		a.Tick.Label.Font = font.From(sans, 10)
		a.Tick.Marker = plainTicks{}
	}
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.TextStyle.Font = font.From(sans, 10)
	legend.Left, legend.Top = true, true
	for _, s := range c.series {
		if s.lo != nil {
			poly, err := plotter.NewPolygon(band(s.lo, s.hi))
			if err != nil {
				return "", fmt.Errorf("%s: %s: %w", c.title, s.name, err)
			}
			poly.Color = s.color
			poly.LineStyle.Width = 0
			p.Add(poly)
			legend.Add(s.name, poly)
			continue
		}
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", c.title, s.name, err)
		}
		l.Color, l.Dashes, l.Width = s.color, s.dashes, vg.Points(1.2)
		if s.width > 0 {
			l.Width = s.width
		}
		p.Add(l)
		thumbs := []plot.Thumbnailer{l}
		if s.points {
			sc, err := plotter.NewScatter(s.xys)
			if err != nil {
				return "", fmt.Errorf("%s: %s: %w", c.title, s.name, err)
			}
			sc.Color, sc.Radius = s.color, vg.Points(2)
			p.Add(sc)
			thumbs = append(thumbs, sc)
		}
		if s.errs != nil {
			eb, err := plotter.NewYErrorBars(errorXYs{s.xys, s.errs})
			if err != nil {
				return "", fmt.Errorf("%s: %s: %w", c.title, s.name, err)
			}
			eb.Color = s.color
			p.Add(eb)
		}
		legend.Add(s.name, thumbs...)
	}
	if c.logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.X.Min = 0
	}
	p.Y.Min = 0
	if !math.IsNaN(c.xMax) {
		p.X.Max = c.xMax
	}
	if !math.IsNaN(c.yMax) {
		p.Y.Max = max(c.yMax, p.Y.Max)
	}
	if c.xTicks != nil {
		p.X.Tick.Marker = plot.ConstantTicks(c.xTicks)
	}
	if p.Y.Max <= p.Y.Min {
		p.Y.Max = p.Y.Min + 1 // a flat zero line, drawn on an axis of 0..1
	}

	canvas := vgsvg.New(chartW, chartH)
	dc := draw.New(canvas)
	lw := legendWidth(legend, c.series)
	p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
	// The legend right of the plot area, under the title's height.
	legend.Draw(draw.Crop(dc, chartW-lw+6, -4, 0, -24))
	var b bytes.Buffer
	if _, err := canvas.WriteTo(&b); err != nil {
		return "", fmt.Errorf("%s: %w", c.title, err)
	}
	s := b.String()
	// The XML prolog and comment before <svg> belong to a file, not to an
	// element inside HTML.
	return s[strings.Index(s, "<svg"):], nil
}

// plainTicks are gonum's default ticks, labelled without trailing
// zeros ("2500", not "2500.00").
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			v, _ := strconv.ParseFloat(strconv.FormatFloat(ts[i].Value, 'g', 6, 64), 64)
			ts[i].Label = strconv.FormatFloat(v, 'f', -1, 64)
		}
	}
	return ts
}

// legendWidth is the width the legend takes right of the plot area.
func legendWidth(l plot.Legend, ss []series) vg.Length {
	w := vg.Length(0)
	for _, s := range ss {
		w = max(w, l.TextStyle.Width(s.name))
	}
	return w + l.ThumbnailWidth + 16
}

// band is the polygon between lo and hi, which share their x values.
func band(lo, hi plotter.XYs) plotter.XYs {
	out := slices.Clone(lo)
	for i := len(hi) - 1; i >= 0; i-- {
		out = append(out, hi[i])
	}
	return out
}

// errorXYs joins points and their error bars for plotter.YErrorBars.
type errorXYs struct {
	plotter.XYs
	plotter.YErrors
}

// Palette is the policies' colors, in order: a colour-blind-safe set of
// twelve, the eight of Okabe and Ito's "Color Universal Design"
// (https://jfly.uni-koeln.de/color/, 2008: blue, vermillion, bluish
// green, reddish purple, orange, sky blue, black, yellow), then four of
// Paul Tol's "muted" qualitative scheme (SRON, "Colour schemes",
// https://personal.sron.nl/~pault/: wine, olive, indigo, purple). The
// Okabe-Ito colors come in an order that puts the most different ones
// first and the yellow, faint on white, last.
var Palette = []color.RGBA{
	rgb(0x0072B2), rgb(0xD55E00), rgb(0x009E73), rgb(0xCC79A7), rgb(0xE69F00), rgb(0x56B4E9), rgb(0x000000), rgb(0xF0E442),
	rgb(0x882255), rgb(0x999933), rgb(0x332288), rgb(0xAA4499),
}

func rgb(v uint32) color.RGBA {
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

// colorOf is the i-th policy's color (Palette) and dashes: solid for
// the first policy, a dash pattern of its own for each other, so that
// lines that lie on each other, and lines whose colors repeat past the
// palette's twelve, still tell apart.
func colorOf(i int) (color.Color, []vg.Length) {
	return Palette[i%len(Palette)], plotutil.Dashes((i + i/len(Palette)) % len(plotutil.DefaultDashes))
}

// simplify drops the points between two neighbours with the same y: on a
// line drawn through points in x order they are on a straight segment,
// so the drawing is the same, with far fewer points for the step-like
// counts of a timeline.
func simplify(xys plotter.XYs) plotter.XYs {
	if len(xys) < 3 {
		return xys
	}
	out := plotter.XYs{xys[0]}
	for i := 1; i < len(xys)-1; i++ {
		if xys[i].Y != xys[i-1].Y || xys[i].Y != xys[i+1].Y {
			out = append(out, xys[i])
		}
	}
	return append(out, xys[len(xys)-1])
}

// MaxWorkerLines is the most workers the in-flight chart draws a line
// for; over it, a line per worker is a block of colour, so the chart
// draws the spread across workers at each sample: the band from the
// least to the most loaded worker, the band from the 10th to the 90th
// percentile, and the median worker's line (quantileBands). That reads
// the same at 3 workers and at 4,096, and its size does not grow with
// the workers.
const MaxWorkerLines = 2

// Band colours of the in-flight quantile chart: ColorBrewer's "Blues"
// (https://colorbrewer2.org, sequential, colour-blind safe), light for
// min–max, medium for p10–p90, dark for the median.
var (
	bandOuter  = rgb(0xC6DBEF)
	bandInner  = rgb(0x6BAED6)
	bandMedian = rgb(0x08519C)
)

// inFlightSeries is tl's in-flight requests over time: one line per
// worker up to MaxWorkerLines workers, else quantileBands. x is seconds
// since the first arrival at each sample's end.
func inFlightSeries(tl *report.Timeline) []series {
	if len(tl.InFlight) == 0 {
		return nil
	}
	workers := len(tl.InFlight[0])
	at := func(k int) float64 { return float64(k+1) * tl.IntervalS }
	if workers <= MaxWorkerLines {
		out := make([]series, workers)
		for w := range workers {
			xys := make(plotter.XYs, len(tl.InFlight))
			for k, row := range tl.InFlight {
				xys[k] = plotter.XY{X: at(k), Y: float64(row[w])}
			}
			col, dash := colorOf(w)
			out[w] = series{name: fmt.Sprintf("worker %d", w), xys: simplify(xys), color: col, dashes: dash}
		}
		return out
	}
	return quantileBands(tl, at)
}

// quantileBands is the spread of tl's in-flight requests across workers
// at each sample: the min–max band, the p10–p90 band and the median
// line. Quantiles are nearest rank over the sample's workers (p10 is
// the value of rank ⌈0.1·n⌉); the median of an even count is the mean
// of the two middle values.
func quantileBands(tl *report.Timeline, at func(int) float64) []series {
	workers := len(tl.InFlight[0])
	n := len(tl.InFlight)
	lo, p10, med, p90, hi := make(plotter.XYs, n), make(plotter.XYs, n), make(plotter.XYs, n), make(plotter.XYs, n), make(plotter.XYs, n)
	rank := func(row []int32, p float64) float64 {
		i := max(0, min(workers-1, int(math.Ceil(p*float64(workers)))-1))
		return float64(row[i])
	}
	row := make([]int32, workers)
	for k := range tl.InFlight {
		copy(row, tl.InFlight[k])
		slices.Sort(row)
		x := at(k)
		lo[k] = plotter.XY{X: x, Y: float64(row[0])}
		hi[k] = plotter.XY{X: x, Y: float64(row[workers-1])}
		p10[k] = plotter.XY{X: x, Y: rank(row, 0.1)}
		p90[k] = plotter.XY{X: x, Y: rank(row, 0.9)}
		m := float64(row[workers/2])
		if workers%2 == 0 {
			m = (float64(row[workers/2-1]) + m) / 2
		}
		med[k] = plotter.XY{X: x, Y: m}
	}
	return []series{
		{name: fmt.Sprintf("min–max of %d workers", workers), lo: lo, hi: hi, color: bandOuter},
		{name: "p10–p90", lo: p10, hi: p90, color: bandInner},
		{name: "median worker", xys: simplify(med), color: bandMedian},
	}
}

// queueChart is the chart of tl's waiting requests over time: the
// engines' queues, and the router's queue drawn over them in a heavier
// line; a router queue of 0 throughout, which would lie hidden on the
// x axis, is left out and said in the chart's note.
func queueChart(title string, tl *report.Timeline, xMax, yMax float64) chart {
	router, engine := make(plotter.XYs, len(tl.RouterQueue)), make(plotter.XYs, len(tl.EngineQueue))
	queued := false
	for k := range tl.RouterQueue {
		x := float64(k+1) * tl.IntervalS
		router[k] = plotter.XY{X: x, Y: float64(tl.RouterQueue[k])}
		engine[k] = plotter.XY{X: x, Y: float64(tl.EngineQueue[k])}
		queued = queued || tl.RouterQueue[k] > 0
	}
	ch := chart{title: title, xLabel: "simulated time (s)", yLabel: "requests waiting", xMax: xMax, yMax: yMax,
		series: []series{{name: "engine queues", xys: simplify(engine), color: Palette[2]}}}
	if queued {
		ch.series = append(ch.series, series{name: "router queue", xys: simplify(router), color: Palette[1], width: vg.Points(2)})
	} else {
		ch.note = "router queue: no request queued in the router (0 throughout), so only the engines' queues are drawn"
	}
	return ch
}

// kvBins is the most points of a KV-hit-over-time line: a timeline's
// samples are merged into at most this many windows, since a ratio over
// the few requests of one sample jumps between 0 and 100%.
const kvBins = 64

// kvSeries is tl's KV hit ratio over time, in percent, against the KV
// reference's: over windows of consecutive samples (at most kvBins), the
// window's cached over prompt tokens (and the reference's hit over
// prompt tokens), at the window's middle; windows without prompt tokens
// are left out.
func kvSeries(tl *report.Timeline) (hit, ref plotter.XYs) {
	n := len(tl.PromptTokens)
	width := max(1, (n+kvBins-1)/kvBins)
	ratio := func(num, den []int64) plotter.XYs {
		var out plotter.XYs
		for start := 0; start < n; start += width {
			end := min(start+width, n)
			var a, b int64
			for k := start; k < end; k++ {
				a, b = a+num[k], b+den[k]
			}
			if b > 0 {
				out = append(out, plotter.XY{X: float64(start+end) / 2 * tl.IntervalS, Y: 100 * float64(a) / float64(b)})
			}
		}
		return out
	}
	return ratio(tl.CachedTokens, tl.PromptTokens), ratio(tl.ReferenceHitTokens, tl.ReferencePromptTokens)
}

// cdf is a distribution's CDF: value (ms) against the share of requests
// at or below it (percent), from report.Distributions' quantiles; values
// of 0 or less are left out for the log axis.
func cdf(quantiles []float64) plotter.XYs {
	var out plotter.XYs
	n := len(quantiles) - 1
	for k, v := range quantiles {
		if v > 0 {
			out = append(out, plotter.XY{X: v, Y: 100 * float64(k) / float64(n)})
		}
	}
	return out
}
