package report

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
}
