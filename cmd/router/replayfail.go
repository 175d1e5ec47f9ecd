package main

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/switchyard-router/switchyard/router/migrate"
	"github.com/switchyard-router/switchyard/router/replay"
)

// addFailureFlags adds router replay's engine failure flags (--fail,
// --fail-rate, --restart-after, --migration-limit; docs/replay.md,
// "Engine failures and migration") to fl, bound to f.
func addFailureFlags(fl *pflag.FlagSet, f *replayFlags) {
	fl.StringArrayVar(&f.fail, "fail", nil,
		"fail an engine: WORKER@TIME, WORKER a worker's name (sim-3) or index, TIME simulated time since the trace's start (90s); comma-separated or repeated; its requests migrate (--migration-limit)")
	fl.Float64Var(&f.failRate, "fail-rate", 0,
		"random engine failures per worker per hour of simulated time (exponential times between failures, drawn from the run's seed)")
	fl.DurationVar(&f.restartAfter, "restart-after", replay.DefaultRestartAfter,
		"with --fail or --fail-rate: how long a failed engine stays out before it rejoins with an empty KV cache")
	fl.IntVar(&f.migrationLimit, "migration-limit", migrate.DefaultLimit,
		"with --fail or --fail-rate: how many times a request cut by a failure may continue on another worker (0: cut requests fail)")
	setWant(fl, "fail", "WORKER@TIME such as sim-3@90s, comma-separated")
	setWant(fl, "fail-rate", fmt.Sprintf("failures per worker-hour, a number from 0 to %d", replay.MaxFailRate))
	setWant(fl, "restart-after", "a duration such as 60s")
	setWant(fl, "migration-limit", "a whole number >= 0")
}

// failuresOf is the replay.Failures the failure flags ask for, nil when
// neither --fail nor --fail-rate is given; every error is a usage error.
func (f *replayFlags) failuresOf(cmd *cobra.Command) (*replay.Failures, error) {
	fs := cmd.Flags()
	if len(f.fail) == 0 && f.failRate == 0 {
		for _, name := range []string{"restart-after", "migration-limit"} {
			if fs.Changed(name) {
				return nil, fmt.Errorf("--%s applies to engine failures: give --fail or --fail-rate", name)
			}
		}
		if fs.Changed("fail") {
			return nil, errors.New("--fail '': want WORKER@TIME such as sim-3@90s")
		}
		return nil, nil
	}
	out := &replay.Failures{Rate: f.failRate, RestartAfter: f.restartAfter, Migration: migrate.DefaultPolicy()}
	out.Migration.Limit = f.migrationLimit
	first := make(map[replay.Failure]string) // each failure's first entry, as given
	for _, v := range f.fail {
		xs, err := replay.ParseFailures(v)
		if err != nil {
			return nil, err
		}
		// ParseFailures gives one failure per comma-separated entry, in order.
		for i, e := range strings.Split(v, ",") {
			e = strings.TrimSpace(e)
			switch prev, dup := first[xs[i]]; {
			case dup && prev == e:
				return nil, fmt.Errorf("--fail: %s is listed twice", e)
			case dup:
				return nil, fmt.Errorf("--fail: %s is listed twice (as %s and %s)", failureName(xs[i]), prev, e)
			}
			first[xs[i]] = e
		}
		out.At = append(out.At, xs...)
	}
	switch {
	case len(out.At) > replay.MaxScheduledFailures:
		return nil, fmt.Errorf("--fail: %d failures, want at most %d", len(out.At), replay.MaxScheduledFailures)
	case f.failRate < 0 || f.failRate > replay.MaxFailRate || math.IsNaN(f.failRate):
		return nil, fmt.Errorf("--fail-rate %v: want failures per worker-hour from 0 to %d", f.failRate, replay.MaxFailRate)
	case f.restartAfter <= 0 || f.restartAfter > replay.MaxRestartAfter:
		return nil, fmt.Errorf("--restart-after %v: want a duration above 0 and at most %v", f.restartAfter, replay.MaxRestartAfter)
	case f.migrationLimit < 0:
		return nil, fmt.Errorf("--migration-limit %d: want a whole number >= 0 (0: cut requests fail)", f.migrationLimit)
	case f.disaggregated(cmd):
		return nil, errors.New("--fail and --fail-rate model aggregated workers only: not with --prefill-workers and --decode-workers")
	case f.replicas > 1:
		return nil, errors.New("--fail and --fail-rate model one router replica only: not with --replicas")
	case f.prefix != "approximate":
		return nil, errors.New("--fail and --fail-rate model approximate prefix mode only: not with --prefix precise or both")
	}
	smallest := math.MaxInt
	for _, fl := range f.fleets(cmd) {
		smallest = min(smallest, fl.Workers)
	}
	for _, x := range out.At {
		if x.Worker >= smallest {
			return nil, fmt.Errorf("--fail sim-%d@%v: the smallest fleet has sim-0 to sim-%d", x.Worker, x.At, smallest-1)
		}
	}
	return out, nil
}

// failureName is f as an entry of --fail: sim-3@1m30s.
func failureName(f replay.Failure) string { return fmt.Sprintf("sim-%d@%v", f.Worker, f.At) }
