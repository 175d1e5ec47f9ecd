package router

import (
	"errors"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-router/switchyard/router/predict"
)

// predictorCollector exports the latency predictor's accuracy as serve's
// metrics, read from the Router's models at scrape time:
//
//	switchyard_predictor_relative_error{target,quantile}
//	switchyard_predictor_comparisons_total{target}
//	switchyard_predictor_classes
//
// target is "ttft" or "tpot", quantile "0.5" or "0.9" (replay reports the
// same figures per run: report.PredictorAccuracy).
type predictorCollector struct {
	r                          *Router
	relErr, comparisons, class *prometheus.Desc
}

func registerPredictor(reg prometheus.Registerer, r *Router) error {
	c := &predictorCollector{r: r,
		relErr: prometheus.NewDesc("switchyard_predictor_relative_error",
			"Relative error |predicted - observed| / observed of the latency predictor's predictions for the workers that served the requests, by target (ttft: dispatch to first token; tpot: mean gap between output tokens after the first) and quantile (0.5, 0.9), as a fraction; to within one log bin (a factor 1.12). NaN before any comparison.",
			[]string{"target", "quantile"}, nil),
		comparisons: prometheus.NewDesc("switchyard_predictor_comparisons_total",
			"Predictions compared with what the worker then took, by target (ttft, tpot).",
			[]string{"target"}, nil),
		class: prometheus.NewDesc("switchyard_predictor_classes",
			"Worker classes the latency predictor keeps a model of (switchyard.io/class labels, or one per unlabelled worker).",
			nil, nil),
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return err
		}
		// A previous Router's collector (a test's case: serve builds one
		// Router per process).
	}
	return nil
}

func (c *predictorCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.relErr
	ch <- c.comparisons
	ch <- c.class
}

func (c *predictorCollector) Collect(ch chan<- prometheus.Metric) {
	acc := &c.r.models.Accuracy
	for _, t := range [...]struct {
		name string
		h    *predict.ErrorHistogram
	}{{"ttft", &acc.TTFT}, {"tpot", &acc.TPOT}} {
		for _, q := range [...]struct {
			label string
			q     float64
		}{{"0.5", 0.5}, {"0.9", 0.9}} {
			v := math.NaN()
			if t.h.Count() > 0 {
				v = t.h.Quantile(q.q)
			}
			ch <- prometheus.MustNewConstMetric(c.relErr, prometheus.GaugeValue, v, t.name, q.label)
		}
		ch <- prometheus.MustNewConstMetric(c.comparisons, prometheus.CounterValue, float64(t.h.Count()), t.name)
	}
	ch <- prometheus.MustNewConstMetric(c.class, prometheus.GaugeValue, float64(c.r.models.Classes()))
}
