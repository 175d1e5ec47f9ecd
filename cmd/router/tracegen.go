package main

import (
	"errors"
	"fmt"
	"math"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/trace/synth"
)

func newTraceCmd() *cobra.Command {
	cmd := commandGroup(&cobra.Command{
		Use:   "trace",
		Short: "Work with request traces",
	})
	cmd.AddCommand(newTraceGenerateCmd())
	return cmd
}

// generateFlags maps the synth.Params fields that router trace generate
// sets to their flags, so that a *synth.ParamError names the flag.
var generateFlags = map[string]string{
	"Requests":        "requests",
	"SessionRate":     "session-rate",
	"BurstFactor":     "burst-factor",
	"MeanTurns":       "mean-turns",
	"ThinkTime":       "think-time",
	"MaxPromptTokens": "max-prompt-tokens",
}

func newTraceGenerateCmd() *cobra.Command {
	p := synth.DefaultParams()
	var out string
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Generate a synthetic multi-turn session trace (Mooncake JSON lines)",
		Long: `Generate writes a synthetic request trace in the Mooncake JSON lines format
that router replay reads: multi-turn chat sessions sharing six system prompts of
several lengths (Zipf popularity), each turn's prompt extending the previous
turn's prompt and answer, with session arrivals alternating between calm
periods and bursts. Every line carries the session's session_id. The same
flags give byte-identical output; the shape and its defaults are documented in
package router/trace/synth and docs/replay.md.

The output is written atomically, only when the whole trace is generated; a
summary line goes to standard error. The bundled
testdata/traces/synthetic_sessions.jsonl is this command's output with the
defaults (no output replaces a trace the repository ships; compare instead):

  router trace generate --seed 1 --out /tmp/synthetic_sessions.jsonl
  cmp /tmp/synthetic_sessions.jsonl testdata/traces/synthetic_sessions.jsonl`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTraceGenerate(cmd, p, out)
		},
	}
	fl := cmd.Flags()
	fl.Uint64Var(&p.Seed, "seed", p.Seed, "seed of the random stream")
	fl.IntVar(&p.Requests, "requests", p.Requests, fmt.Sprintf("number of requests, 1 to %d", synth.MaxRequests))
	fl.StringVar(&out, "out", "-", "output file, or - for standard output")
	fl.Float64Var(&p.SessionRate, "session-rate", p.SessionRate, "new sessions per second of simulated time in calm periods")
	fl.Float64Var(&p.BurstFactor, "burst-factor", p.BurstFactor, "session rate during bursts, as a multiple of --session-rate (1: no bursts)")
	fl.Float64Var(&p.MeanTurns, "mean-turns", p.MeanTurns, "mean turns per session (geometric), before the prompt cap")
	fl.DurationVar(&p.ThinkTime, "think-time", p.ThinkTime, "mean time a user takes to send the next turn after the answer")
	fl.IntVar(&p.MaxPromptTokens, "max-prompt-tokens", p.MaxPromptTokens, "longest prompt in tokens; a session ends rather than exceed it")
	setWant(fl, "seed", fmt.Sprintf("a whole number from 0 to %d", uint64(math.MaxUint64)))
	setWant(fl, "requests", fmt.Sprintf("a whole number from 1 to %d", synth.MaxRequests))
	setWant(fl, "session-rate", "a number of sessions per second from 0.01 to 10000")
	setWant(fl, "burst-factor", "a number from 1 to 1000")
	setWant(fl, "mean-turns", "a number from 1 to 1000")
	setWant(fl, "think-time", "a duration from 0 to 24h, such as 20s or 1m")
	setWant(fl, "max-prompt-tokens", "a whole number of tokens")
	return cmd
}

// runTraceGenerate checks the parameters, generates the trace into a
// pending output and commits it.
func runTraceGenerate(cmd *cobra.Command, p synth.Params, out string) error {
	if cmd.Flags().Changed("out") && out == "" {
		return errors.New("--out '': want a file name, or - for standard output")
	}
	if err := p.Validate(); err != nil {
		var pe *synth.ParamError
		if errors.As(err, &pe) {
			if flag, ok := generateFlags[pe.Field]; ok {
				return fmt.Errorf("--%s %s: want %s", flag, pe.Value, pe.Want)
			}
		}
		return err // a usage error: exit 2
	}
	if err := checkOutputPaths([]namedPath{{"--out", out}}, nil); err != nil {
		return err // a usage error: exit 2
	}
	w, err := createOutput("--out", out, kindGeneratedTrace, cmd.OutOrStdout())
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	defer w.abort()
	sum, err := synth.WriteJSONL(w, p)
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("--out %s: %w", out, err)}
	}
	if err := w.commit(); err != nil {
		return &exitError{code: 1, err: err}
	}
	name := out
	if out == "-" {
		name = "standard output"
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "router: wrote %d requests of %d sessions over %.0f s of simulated time (%d bursts) to %s\n",
		sum.Requests, sum.Sessions, sum.Last.Seconds(), len(sum.Bursts), name)
	return nil
}
