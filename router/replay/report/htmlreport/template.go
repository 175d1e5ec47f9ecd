package htmlreport

import "html/template"

// pageTemplate is the page: inline style only, no script.
var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="switchyard router replay">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font-family: "Liberation Sans", Arial, Helvetica, sans-serif; margin: 1.5rem; color: #222; max-width: 1500px; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05rem; margin: 1.2rem 0 .4rem; }
.meta { color: #555; margin: .2rem 0; }
pre { background: #f4f4f4; padding: .5rem; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { border-bottom: 1px solid #e2e2e2; padding: .3rem .5rem; text-align: right; vertical-align: top; }
th { background: #f4f4f4; position: sticky; top: 0; }
th .unit { display: block; font-weight: normal; color: #666; }
td.label, th.label { text-align: left; white-space: nowrap; position: sticky; left: 0; background: #fff; z-index: 1; }
th.label { background: #f4f4f4; z-index: 2; }
td .range, td .delta { display: block; font-size: .75rem; color: #666; white-space: nowrap; }
td .better { color: #17702d; }
td .worse { color: #b3261e; }
.scroll { overflow-x: auto; }
.legend { font-size: .8rem; color: #444; padding-left: 1.2rem; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(400px, 1fr)); gap: .8rem; }
figure { margin: 0; }
figure svg { width: 100%; height: auto; }
figure svg text { font-family: "Liberation Sans", Arial, Helvetica, sans-serif !important; }
.note { color: #8a5a00; font-size: .85rem; }
.summary { font-size: 1.05rem; font-weight: bold; }
.verdicts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 24rem), 1fr)); gap: .8rem; }
table.decision { width: 100%; }
table.decision th, table.decision td { text-align: left; position: static; }
table.decision th[scope=row] { font-weight: normal; color: #444; white-space: nowrap; width: 8rem; background: #fafafa; }
table.decision td { overflow-wrap: anywhere; }
td .margin { display: block; font-size: .75rem; color: #555; }
td .split { color: #b3261e; }
td .tie { color: #555; }
td.best { background: #eef3fb; }
details > summary { cursor: pointer; color: #8a5a00; font-size: .85rem; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">Trace {{.Trace}}, {{.Requests}} requests per run{{if gt .Seeds 1}}, {{.Seeds}} seeds per row{{end}}.{{if .SLO}} Goodput targets (--slo): {{.SLO}}.{{end}}</p>
{{with .Command}}<pre>{{.}}</pre>{{end}}

<section id="decide">
{{if or .Decision.Fleets .Verdict}}<h2 id="verdict">Verdict</h2>
{{with .Decision.Summary}}<p class="summary">{{.}}</p>{{end}}
{{with .Verdict}}<p class="verdict"><strong>{{.}}</strong></p>{{end}}
{{if .Decision.Fleets}}<div class="verdicts">
{{range .Decision.Fleets}}<div class="verdict-fleet">
<table class="decision">
<thead><tr><th colspan="2" class="fleet">{{.Fleet}}</th></tr></thead>
<tbody>
{{range .Cells}}<tr><th scope="row">best {{.Header}} {{.Better}}</th><td>{{if .Label}}{{if .Tie}}<span class="tie">{{.Label}}</span>{{else}}<strong>{{.Label}}</strong>{{end}} {{.Value}}<span class="margin">{{.Margin}}</span>{{if .Seeds}}<span class="margin{{if .Split}} split{{end}}">{{.Seeds}}</span>{{end}}{{else}}–{{end}}</td></tr>
{{end}}</tbody>
</table>
</div>
{{end}}</div>
<p class="meta">Best = the best median of the fleet's rows; the margin is over the next row, in percentage points for shares and in percent for other figures. Within noise: under {{.NoisePP}} pp, or under {{.NoiseRelative}}% of the next row's value. Seeds agree when the best row is also best on that seed's own runs.</p>{{end}}
{{end}}

<h2 id="comparison">Comparison</h2>
<div class="scroll">
<table id="comparison-table">
<thead><tr><th class="label">policy</th>{{if .Table.Fleets}}<th>workers</th>{{end}}{{range .Table.Columns}}<th>{{.Header}}<span class="unit">{{.Unit}}{{with .Better}} {{.}}{{end}}</span></th>{{end}}</tr></thead>
<tbody>
{{range .Table.Rows}}<tr><td class="label">{{.Label}}{{if .Baseline}}<span class="range">baseline</span>{{end}}</td>{{if $.Table.Fleets}}<td>{{.Fleet}}</td>{{end}}{{range .Cells}}<td{{if .Best}} class="best"{{end}}>{{if .Best}}<strong>{{.Value}}</strong>&nbsp;★{{else}}{{.Value}}{{end}}{{if .Range}}<span class="range">{{.Range}}</span>{{end}}{{if .Delta}}<span class="delta{{if .Better}} better{{else if .Worse}} worse{{end}}">{{if .Better}}▲ {{else if .Worse}}▼ {{end}}{{.Delta}}</span>{{end}}</td>{{end}}</tr>
{{end}}</tbody>
</table>
</div>
<ul class="legend">
<li><strong>bold</strong>&nbsp;★ marks the best value of its fleet in each column with a direction, only where it beats the next row beyond the noise, the verdict's rule (under {{.NoisePP}} pp for shares, under {{.NoiseRelative}}% otherwise, no mark)</li>
{{if gt .Seeds 1}}<li>each cell: the median of {{.Seeds}} seeds, with the least–greatest under it when they differ</li>{{end}}
<li>latencies in ms of simulated time; ↓ lower is better, ↑ higher is better</li>
{{if .Table.Delta}}<li>under each value: its change against {{.Table.Delta}}'s on the same fleet: in percentage points (pp) for shares (columns in %), in percent for other figures (▲ green better, ▼ red worse); none where the row shows the baseline's value</li>{{end}}
{{range .Table.Legend}}<li>{{.}}</li>
{{end}}</ul>
</section>

{{if .Failures}}<h2 id="failures">Engine failures</h2>
<ul class="legend">{{range .Failures}}<li>{{.}}</li>
{{end}}</ul>
<p class="meta">Latencies in ms of simulated time; the gap is from a cut to the next token the client receives.</p>
{{end}}
{{range .Fleets}}
<h2 id="cdf-{{.Fleet}}">Latency distributions{{if gt (len $.Fleets) 1}}, {{.Heading}}{{end}}</h2>
<div class="grid">{{range .CDFs}}{{template "figure" .}}{{end}}</div>
<h2 id="time-{{.Fleet}}">Over time{{if gt (len $.Fleets) 1}}, {{.Heading}}{{end}}</h2>
{{range .Cells}}<h3>{{.Label}}</h3>
<div class="grid">{{range .Figures}}{{template "figure" .}}{{end}}</div>
{{end}}{{end}}

{{if .Sweep}}<h2 id="sweep">Against fleet size</h2>
<p class="meta">Each point is a row of the table: the median of its seeds, with bars from the least to the greatest.</p>
<div class="grid">{{range .Sweep}}{{template "figure" .}}{{end}}</div>
{{end}}
</body>
</html>
{{define "figure"}}{{if .SVG}}{{if .Collapsed}}<details class="collapsed"><summary>{{.Collapsed}}</summary>{{end}}<figure>{{.SVG}}{{with .Note}}<figcaption class="note">{{.}}</figcaption>{{end}}</figure>{{if .Collapsed}}</details>{{end}}{{else}}<p class="note">{{.Note}}</p>{{end}}{{end}}`))
