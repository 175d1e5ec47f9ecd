// Package report is what a replay reports and how it is shown, apart from
// the simulated-time driver (package replay) that fills it: the summary of
// one run (Report, with its latency Summaries, goodput under an SLO, the
// KV reference, the Timeline and the fallbacks' sources), the table that
// compares runs (Cell, Metric, Comparison, WriteComparison), the
// baselines and goodput verdicts of a sweep (Delta, BaselineOf,
// SmallestFleets, GoodputVerdict), and the stderr lines on fallbacks and
// failing shadows (WriteFallbacks, WriteShadowFailures). Subpackage
// htmlreport draws the same figures as an HTML page.
//
// It holds data and formatting only: it imports router/config and shared
// for names (the default policy's, the roles) and never the router, the
// simulation or package replay, which imports it.
package report
