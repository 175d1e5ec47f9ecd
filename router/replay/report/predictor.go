package report

import (
	"fmt"
	"io"
)

// PredictorAccuracy is the latency predictor's relative error,
// |predicted − observed| / observed, over one replay's decisions: TTFT
// from dispatch to the first token, TPOT the mean gap between output
// tokens after the first. Quantiles are the upper edges of log-spaced
// bins a factor 10^(1/20) ≈ 1.12 wide (router/predict.ErrorHistogram),
// as fractions (0.12 = 12%).
type PredictorAccuracy struct {
	// TTFTN and TPOTN count the predictions compared: the decisions made
	// once a model had heard an answer, whose answer then came.
	TTFTN int64 `json:"ttft_n"`
	TPOTN int64 `json:"tpot_n"`
	// TTFTP50 and TTFTP90 are the median and p90 relative TTFT error;
	// TPOTP50 and TPOTP90 the same for TPOT. 0 when its count is 0.
	TTFTP50 float64 `json:"ttft_p50"`
	TTFTP90 float64 `json:"ttft_p90"`
	TPOTP50 float64 `json:"tpot_p50"`
	TPOTP90 float64 `json:"tpot_p90"`
	// Read is true when a policy of the run read the predictions (it
	// declared LATENCY); otherwise they were made for this report only.
	Read bool `json:"read"`
}

// WritePredictor writes r's predictor accuracy as one line, "router:
// LABEL: latency predictor, relative error p50/p90: ...", for stderr;
// nothing when the report has none or no policy of the run read the
// predictions (PredictorAccuracy.Read: the JSON report has them anyway).
func WritePredictor(w io.Writer, r *Report) error {
	p := r.Predictor
	if p == nil || !p.Read {
		return nil
	}
	_, err := fmt.Fprintf(w, "router: %s, %d workers: latency predictor, relative error p50/p90: TTFT %.1f%%/%.1f%% (%d compared), TPOT %.1f%%/%.1f%% (%d compared)\n",
		r.Label(), r.Workers, 100*p.TTFTP50, 100*p.TTFTP90, p.TTFTN, 100*p.TPOTP50, 100*p.TPOTP90, p.TPOTN)
	return err
}
