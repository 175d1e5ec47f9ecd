// Package predict is the router's online latency predictor: for one
// request on one candidate worker it predicts the time to first token
// (TTFT, from dispatch to the first token) and the mean time per output
// token after the first (TPOT, the inter-token latency), from what the
// router knows at decision time (Features), and it learns from every
// answer's observed TTFT and inter-token gaps.
//
// # The model
//
// Each target is a linear model of a few physically motivated features
// (see Features.ttft and Features.tpot), fitted by recursive least
// squares (RLS) with exponential forgetting (Haykin, Adaptive Filter
// Theory, 5th ed., section 10.3; Ljung and Söderström, Theory and
// Practice of Recursive Identification, 1983), weighted by the inverse
// square of each observation, so that it minimises the squared relative
// error Σ λ^(n-k) ((y_k - w·x_k) / y_k)² rather than the absolute one:
// SLO decisions are about ratios to a target, and a model fitted to
// absolute errors serves short answers badly whenever long ones exist.
//
// Why this model (BENCHMARKS.md, "Latency predictor", has the figures):
// the engine's step time is linear in the tokens it batches and in the
// context its decodes read (Vidur, Agrawal et al., MLSys 2024; the
// DistServe and Sarathi-Serve step models; router/sim/README.md), so the
// time to drain a worker's booked prefill, and the step time a decode
// sees, are close to linear in the router's own bookings. RLS converges in
// a few dozen observations with no learning rate to tune, an update costs
// O(d²) for d features (d = 6 here: 36 multiply-adds), and a prediction
// is a dot product: a few nanoseconds, no allocation. On the same
// replays it was compared with RLS on absolute errors and with a
// shorter memory (λ = 0.99): on the bundled
// traces at 4, 8 and 16 simulated workers the relative-error RLS at
// λ = 0.999 had the lowest or equal median and p90 relative error in
// every cell but one, and the absolute fit's TPOT error was up to four
// times larger (BENCHMARKS.md, "Latency predictor", has the table).
// llm-d's predicted-latency scheduler trains XGBoost models in sidecars
// (llm-d/llm-d-inference-scheduler, "latencypredictor"); a tree
// ensemble fits non-linear queueing better but costs microseconds per
// prediction and a model server, which is what this package avoids.
//
// # Classes
//
// Models are kept per worker class (Set): the value of a worker's
// switchyard.io/class label (shared.LabelClass) when it has one (workers that share hardware share a
// model and learn from each other's answers), else the worker alone (a
// mixed fleet is modelled with no configuration). Until a class has
// heard MinObservations answers its predictions come from the pooled
// model of every worker; until that has, predictions are 0 and
// Prediction.Trained is false.
//
// # Concurrency
//
// Predict is lock-free: a model's weights are published as an immutable
// copy behind an atomic pointer, so a prediction never sees half of an
// update. Observe takes the model's mutex for one O(d²) update and calls
// nothing that blocks.
package predict
