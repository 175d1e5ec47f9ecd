// Package sim is a deterministic discrete-event model of LLM inference
// workers for router replay: each Worker is one vLLM-V1-like engine serving
// Llama-3.1-8B-Instruct (bf16) on one H100-SXM-80GB, with a per-step time
// model, a vLLM V1 scheduler (chunked prefill, FCFS admission, recompute
// preemption newest first) and a prefix-cached paged KV store.
//
// The model, its coefficients and their sources are specified in
// README.md (Model: step time, scheduler and KV; Trace blocks: the Mooncake
// block mapping); router/sim/README.md lists the approximations made for
// speed. Time is simulated: every time is a time.Duration since the start of
// the replay, all arithmetic is integer (picoseconds internally), no map is
// iterated and no wall clock is read, so equal inputs give byte-identical
// event streams on every platform.
//
// A Worker or Cluster is not safe for concurrent use.
package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Timing holds the step-time coefficients of README.md, Model, in
// milliseconds exactly as tabulated there. A step that runs D decodes with
// contexts ctx_j and prefill chunks of c_i new tokens over p_i tokens already
// in KV takes, with N = D + Σc_i tokens and B = D + (number of chunks)
// sequences,
//
//	t = Fixed + PerSeq·B + max(WeightFloor, ComputeBase + PerToken·N)
//	  + PrefillAttn · Σ c_i·(p_i + c_i/2) + DecodeAttn · Σ ctx_j
//
// (the Vidur/DistServe split into dense GEMMs, causal prefill attention and
// memory-bound decode attention; README.md, Model, names the sources).
// Every coefficient must be finite and >= 0. Internally each is rounded to
// whole picoseconds, and step durations to whole nanoseconds.
type Timing struct {
	// Fixed is t_fix, per-step overhead (scheduling, sampling, launch).
	// Default 0.5 ms: BLIS β₇ = 0.126 ms plus sampling; vLLM v0.6.0 blog.
	Fixed float64
	// PerSeq is t_seq, per scheduled sequence. Default 0.005 ms: BLIS β₆ =
	// 4.4 µs, black-box β₂ = 6.0 µs.
	PerSeq float64
	// WeightFloor is t_w, the dense-GEMM weight-read floor. Default 6.0 ms:
	// Vidur H100 Llama-2-7B mlp.csv per-layer operators at 1 token × 32
	// layers = 5.6 ms, ×1.078 for Llama-3-8B (≈75 % of peak bandwidth).
	WeightFloor float64
	// ComputeBase is t_b, the intercept of the compute-bound GEMM line.
	// Default 1.5 ms, fitted on the same Vidur profile for N >= 512.
	ComputeBase float64
	// PerToken is t_tok, the compute-bound GEMM slope per batched token.
	// Default 0.021 ms (≈665 TFLOPS, 67 % of the H100 bf16 peak).
	PerToken float64
	// PrefillAttn is a_pf, per (new × attended) token pair of causal prefill
	// attention. Default 1.05e-6 ms: 4·L·H·d_h = 524,288 FLOPs per pair at
	// ≈500 TFLOPS.
	PrefillAttn float64
	// DecodeAttn is a_dec, per context token of a decode (KV read). Default
	// 7.6e-5 ms: 128 KiB per token at 1.72 TB/s (BLIS trained-physics
	// β₂ᵦ = 1.947 of peak).
	DecodeAttn float64
}

// DefaultTiming returns the step-time coefficients of README.md, Model, for
// Llama-3.1-8B-Instruct bf16 on one H100-SXM-80GB.
func DefaultTiming() Timing {
	return Timing{
		Fixed:       0.5,
		PerSeq:      0.005,
		WeightFloor: 6.0,
		ComputeBase: 1.5,
		PerToken:    0.021,
		PrefillAttn: 1.05e-6,
		DecodeAttn:  7.6e-5,
	}
}

// Validate reports a negative, NaN or infinite coefficient, or one above
// 1000 s. Step arithmetic is int64 picoseconds, exact while every term of a
// step stays below 9.2e18 ps (about 106 days), which holds by many orders of
// magnitude for coefficients near the defaults.
func (t Timing) Validate() error {
	for _, f := range [...]struct {
		name string
		v    float64
	}{
		{"Fixed", t.Fixed}, {"PerSeq", t.PerSeq}, {"WeightFloor", t.WeightFloor},
		{"ComputeBase", t.ComputeBase}, {"PerToken", t.PerToken},
		{"PrefillAttn", t.PrefillAttn}, {"DecodeAttn", t.DecodeAttn},
	} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > maxCoefMs {
			return fmt.Errorf("sim: Timing.%s = %v ms, want 0 <= v <= %v", f.name, f.v, float64(maxCoefMs))
		}
	}
	return nil
}

// maxCoefMs bounds a coefficient (1000 s, in ms).
const maxCoefMs = 1e6

// MinSpeed and MaxSpeed bound a worker's speed (Timing.Scaled): from 100
// times slower to 100 times faster than the modelled H100. Within them the
// scaled default coefficients keep at least two significant digits after
// rounding to whole picoseconds (PrefillAttn, the smallest, is 1,050 ps at
// speed 1 and 10.5 → 11 ps at speed 100); beyond them a typo such as 1e9
// would make every step round to 0 ns.
const (
	MinSpeed = 0.01
	MaxSpeed = 100.0
)

// Scaled returns t for an engine speed times as fast as the one t models:
// every coefficient divided by speed, so every step takes 1/speed as long
// (to the rounding of each coefficient to whole picoseconds, at most
// 0.5 ps: for the defaults at speed 10 at most 0.5% on PrefillAttn, the
// smallest at 105 ps, and 0.007% on DecodeAttn; and of the step to whole
// nanoseconds. For speed 2 and the defaults, whose picosecond values are
// all even, only the latter). Speed 1 returns t unchanged.
//
// The model (README.md, Model, "Mixed hardware") is that of a GPU speed
// times faster in both its compute-bound terms (ComputeBase, PerToken,
// PrefillAttn: the dense GEMMs and prefill attention, FLOP-bound) and its
// memory-bound ones (WeightFloor, DecodeAttn: weight and KV reads,
// bandwidth-bound), as the Vidur/DistServe split of the step time makes
// them. The simplification: Fixed and PerSeq, the per-step and
// per-sequence overheads (scheduling, sampling, kernel launch; BLIS β₇ and
// β₆), are host-side in a real engine and would not speed up with the
// GPU; Scaled divides them too, so a whole engine is speed times faster.
// Keeping them fixed would make a speed-2 worker 1.86 times as fast on a
// 1×1k-context decode step and 1.995 times on an 8k-token prefill (the
// sanity table's 6.58 ms and 209.27 ms). The KV capacity (Config) is not
// changed: a faster GPU with more memory is a Config of its own.
//
// Errors: speed NaN, infinite, or outside [MinSpeed, MaxSpeed].
func (t Timing) Scaled(speed float64) (Timing, error) {
	if err := CheckSpeed(speed); err != nil {
		return Timing{}, err
	}
	if speed == 1 {
		return t, nil
	}
	return Timing{
		Fixed:       t.Fixed / speed,
		PerSeq:      t.PerSeq / speed,
		WeightFloor: t.WeightFloor / speed,
		ComputeBase: t.ComputeBase / speed,
		PerToken:    t.PerToken / speed,
		PrefillAttn: t.PrefillAttn / speed,
		DecodeAttn:  t.DecodeAttn / speed,
	}, nil
}

// CheckSpeed reports a speed Timing.Scaled refuses: NaN, infinite, or
// outside [MinSpeed, MaxSpeed]. The error wraps ErrInvalidConfig.
func CheckSpeed(speed float64) error {
	if !(speed >= MinSpeed && speed <= MaxSpeed) { // NaN fails both
		return fmt.Errorf("%w: speed %v, want a number from %v to %v (1: the modelled H100)", ErrInvalidConfig, speed, MinSpeed, MaxSpeed)
	}
	return nil
}

// StepShape is the work of one engine step, the input of Timing.StepTime.
type StepShape struct {
	Decodes       int   // D: sequences decoding one token
	DecodeContext int64 // Σ ctx_j: tokens each decode attends to (its KV plus itself), summed
	Chunks        int   // prefill chunks (one per prefilling sequence)
	PrefillTokens int64 // Σ c_i: new prompt tokens in those chunks
	// PrefillPairs2 is Σ c_i·(2·p_i + c_i), twice the causal attention pair
	// count Σ c_i·(p_i + c_i/2), kept doubled so it stays an integer.
	PrefillPairs2 int64
}

// timingPS is Timing compiled to integer picoseconds.
type timingPS struct {
	fixed, perSeq, floor, base, perTok, pf, dec int64
}

func (t Timing) compile() timingPS {
	ps := func(ms float64) int64 { return int64(math.Round(ms * 1e9)) }
	return timingPS{
		fixed: ps(t.Fixed), perSeq: ps(t.PerSeq), floor: ps(t.WeightFloor),
		base: ps(t.ComputeBase), perTok: ps(t.PerToken),
		pf: ps(t.PrefillAttn), dec: ps(t.DecodeAttn),
	}
}

// stepNS is the step-time formula in integer picoseconds, rounded to the
// nearest nanosecond. Both the worker's general path and its decode fast
// path use it, so they agree to the nanosecond.
func (k *timingPS) stepNS(d int, ctx int64, chunks int, ptok, pairs2 int64) time.Duration {
	n := int64(d) + ptok
	gemm := max(k.floor, k.base+k.perTok*n)
	ps := k.fixed + k.perSeq*int64(d+chunks) + gemm + k.pf*pairs2/2 + k.dec*ctx
	return time.Duration((ps + 500) / 1000)
}

// StepTime returns the modelled duration of one step of shape s, rounded to
// the nanosecond (the formula is in the Timing doc). It does not validate t.
func (t Timing) StepTime(s StepShape) time.Duration {
	k := t.compile()
	return k.stepNS(s.Decodes, s.DecodeContext, s.Chunks, s.PrefillTokens, s.PrefillPairs2)
}

// Config configures one simulated worker. DefaultConfig gives the
// values of README.md, Model: scheduler; every field must be positive.
type Config struct {
	// BlockSize is the KV block (page) size in tokens. Default 16, the vLLM
	// CUDA platform default (vllm/platforms/cuda.py).
	BlockSize int
	// TotalKVBlocks is the KV capacity in blocks. Default 27,500 blocks =
	// 440,000 tokens (53.7 GiB at 128 KiB per token): 0.9 × 79.65 GiB −
	// 14.96 GiB weights − ≈3 GiB activations (README.md, Model: scheduler; BLIS range
	// 26,150–29,205).
	TotalKVBlocks int
	// MaxNumBatchedTokens is the per-step token budget shared by decodes and
	// prefill chunks. Default 8192 (vLLM engine/arg_utils.py for >= 70 GiB
	// non-A100 GPUs behind the API server; Dynamo mocker default).
	MaxNumBatchedTokens int
	// MaxNumSeqs caps the running sequences. Default 256 (Dynamo mocker
	// default; vLLM's H100 default is 1024 but KV binds first).
	MaxNumSeqs int
	// Timing is the step-time model; default DefaultTiming().
	Timing Timing
}

// DefaultConfig returns the scheduler and KV defaults of README.md, Model, with
// DefaultTiming.
func DefaultConfig() Config {
	return Config{
		BlockSize:           16,
		TotalKVBlocks:       27500,
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          256,
		Timing:              DefaultTiming(),
	}
}

// maxInt32Field bounds the block and token counts so that per-request
// counters fit the worker's compact int32 bookkeeping.
const maxInt32Field = math.MaxInt32

// Validate reports a non-positive or out-of-range field, or an invalid
// Timing. Every error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	for _, f := range [...]struct {
		name string
		v    int
	}{
		{"BlockSize", c.BlockSize}, {"TotalKVBlocks", c.TotalKVBlocks},
		{"MaxNumBatchedTokens", c.MaxNumBatchedTokens}, {"MaxNumSeqs", c.MaxNumSeqs},
	} {
		if f.v <= 0 || f.v > maxInt32Field {
			return fmt.Errorf("%w: %s = %d, want 1..%d", ErrInvalidConfig, f.name, f.v, maxInt32Field)
		}
	}
	if err := c.Timing.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

// Errors returned by this package; test them with errors.Is.
var (
	// ErrInvalidConfig: Config.Validate failed.
	ErrInvalidConfig = errors.New("sim: invalid config")
	// ErrInvalidRequest: a Request with a non-positive InputLength, a
	// negative OutputLength, or prefix hashes with a PrefixBlockTokens that
	// is not a positive multiple of BlockSize.
	ErrInvalidRequest = errors.New("sim: invalid request")
	// ErrRequestTooLarge: the request's prompt plus output needs more KV
	// blocks than the worker has, so it could never run (vLLM rejects such
	// prompts at admission).
	ErrRequestTooLarge = errors.New("sim: request does not fit the KV cache")
	// ErrTimeWentBackwards: Submit at a time before one the worker was
	// already advanced or submitted to.
	ErrTimeWentBackwards = errors.New("sim: time went backwards")
	// ErrNoSuchWorker: Cluster.Submit with a worker index out of range.
	ErrNoSuchWorker = errors.New("sim: no such worker")
)
