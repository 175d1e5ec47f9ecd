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
	"gonum.org/v1/plot/palette"
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
}

// series is one legend entry: a line, or a filled band between two
// lines.
type series struct {
	name   string
	xys    plotter.XYs
	color  color.Color
	dashes []vg.Length
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

// colorOf is the i-th policy's color: the soft palette, with dashes
// telling apart lines whose colors repeat.
func colorOf(i int) (color.Color, []vg.Length) {
	n := len(plotutil.SoftColors)
	return plotutil.SoftColors[i%n], plotutil.Dashes(i / n)
}

// workerColors are n distinguishable colors, one per worker.
func workerColors(n int) []color.Color {
	return palette.Rainbow(n, palette.Red, palette.Magenta, 0.8, 0.85, 1).Colors()
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
// for; over it, the chart draws the median worker and the band between
// the least and the most loaded.
const MaxWorkerLines = 16

// inFlightSeries is tl's in-flight requests over time: one line per
// worker, or for more than MaxWorkerLines workers the median worker's
// line and the min–max band across workers. x is seconds since the first
// arrival at each sample's end.
func inFlightSeries(tl *report.Timeline) []series {
	if len(tl.InFlight) == 0 {
		return nil
	}
	workers := len(tl.InFlight[0])
	at := func(k int) float64 { return float64(k+1) * tl.IntervalS }
	if workers <= MaxWorkerLines {
		colors := workerColors(workers)
		out := make([]series, workers)
		for w := range workers {
			xys := make(plotter.XYs, len(tl.InFlight))
			for k, row := range tl.InFlight {
				xys[k] = plotter.XY{X: at(k), Y: float64(row[w])}
			}
			out[w] = series{name: fmt.Sprintf("worker %d", w), xys: simplify(xys), color: colors[w]}
		}
		return out
	}
	lo, med, hi := make(plotter.XYs, len(tl.InFlight)), make(plotter.XYs, len(tl.InFlight)), make(plotter.XYs, len(tl.InFlight))
	row := make([]int32, workers)
	for k := range tl.InFlight {
		copy(row, tl.InFlight[k])
		slices.Sort(row)
		x := at(k)
		lo[k] = plotter.XY{X: x, Y: float64(row[0])}
		hi[k] = plotter.XY{X: x, Y: float64(row[workers-1])}
		m := float64(row[workers/2])
		if workers%2 == 0 {
			m = (float64(row[workers/2-1]) + m) / 2
		}
		med[k] = plotter.XY{X: x, Y: m}
	}
	c, _ := colorOf(0)
	return []series{
		{name: fmt.Sprintf("min–max of %d workers", workers), lo: lo, hi: hi, color: color.RGBA{R: 0x99, G: 0xbb, B: 0xdd, A: 0xff}},
		{name: "median worker", xys: simplify(med), color: c},
	}
}

// queueSeries is tl's router queue and engines' waiting requests over
// time.
func queueSeries(tl *report.Timeline) []series {
	router, engine := make(plotter.XYs, len(tl.RouterQueue)), make(plotter.XYs, len(tl.EngineQueue))
	for k := range tl.RouterQueue {
		x := float64(k+1) * tl.IntervalS
		router[k] = plotter.XY{X: x, Y: float64(tl.RouterQueue[k])}
		engine[k] = plotter.XY{X: x, Y: float64(tl.EngineQueue[k])}
	}
	c0, _ := colorOf(0)
	c1, _ := colorOf(1)
	return []series{
		{name: "router queue", xys: simplify(router), color: c0},
		{name: "engine queues", xys: simplify(engine), color: c1},
	}
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
