package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/bundled"
	"github.com/switchyard-router/switchyard/router/trace"
)

type replayFlags struct {
	policy     string
	trace      string
	workers    int
	prefill    int
	decode     int
	seed       int64
	limit      int
	perRequest string
	report     string
	compare    []string
}

func newReplayCmd() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a recorded trace through a policy on simulated workers",
		Long: `Replay drives a trace through a policy on simulated workers, in simulated
time, and prints a summary table. With no flags it replays the bundled Mooncake
conversation trace (12,031 requests) through the built-in default policy
(kv-cost + min-cost) on 8 simulated workers. The same inputs and seed give
byte-identical --per-request output.

With --prefill-workers N --decode-workers M it replays disaggregated serving:
each request is routed by the policy's prefill role to one of N prefill
workers, which compute its prompt and first token, then by the decode role to
one of M decode workers, which receive its prompt's KV (128 KiB per token at
50 GB/s) and generate the rest.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplay(cmd, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.policy, "policy", "", "HCL policy file (default: the built-in default policy)")
	fl.StringVar(&f.trace, "trace", "", "trace file: Mooncake .jsonl or Azure .csv (default: the bundled conversation trace)")
	fl.IntVar(&f.workers, "workers", replay.DefaultWorkers, "number of simulated aggregated workers")
	fl.IntVar(&f.prefill, "prefill-workers", 0, "number of simulated prefill workers (disaggregated serving; needs --decode-workers)")
	fl.IntVar(&f.decode, "decode-workers", 0, "number of simulated decode workers (disaggregated serving; needs --prefill-workers)")
	fl.Int64Var(&f.seed, "seed", replay.DefaultSeed, "seed for every seeded component without its own seed (overrides router.seed; used when the file sets none)")
	fl.IntVar(&f.limit, "limit", 0, "replay only the first N requests (0: all)")
	fl.StringVar(&f.perRequest, "per-request", "", "write one JSON line per request to FILE")
	fl.StringVar(&f.report, "report", "", "write the summary as JSON to FILE")
	fl.StringSliceVar(&f.compare, "compare", nil, "run each policy file FILE,FILE,... on the same trace and print one table")
	return cmd
}

func runReplay(cmd *cobra.Command, f *replayFlags) error {
	fs := cmd.Flags()
	disagg := fs.Changed("prefill-workers") || fs.Changed("decode-workers")
	switch {
	case disagg && fs.Changed("workers"):
		return errors.New("--workers sets aggregated workers: it cannot be combined with --prefill-workers or --decode-workers")
	case disagg && (!fs.Changed("prefill-workers") || !fs.Changed("decode-workers")):
		return errors.New("disaggregated serving needs both --prefill-workers and --decode-workers")
	case disagg && f.prefill < 1:
		return fmt.Errorf("--prefill-workers %d: want >= 1", f.prefill)
	case disagg && f.decode < 1:
		return fmt.Errorf("--decode-workers %d: want >= 1", f.decode)
	case f.workers < 1:
		return fmt.Errorf("--workers %d: want >= 1", f.workers)
	}
	if f.limit < 0 {
		return fmt.Errorf("--limit %d: want >= 0", f.limit)
	}
	if len(f.compare) > 0 && (f.policy != "" || f.perRequest != "") {
		return errors.New("--compare runs several policies: it cannot be combined with --policy or --per-request")
	}
	records, traceName, err := loadTrace(f.trace)
	if err != nil {
		return &exitError{code: 1, err: err}
	}
	if f.limit > 0 && f.limit < len(records) {
		records = records[:f.limit]
	}
	var seed *int64
	if cmd.Flags().Changed("seed") {
		seed = &f.seed
	}
	policies := f.compare
	if len(policies) == 0 {
		policies = []string{f.policy}
	}
	var reports []*replay.Report
	for _, path := range policies {
		b, err := loadPolicy(cmd.ErrOrStderr(), path, seed)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		name := "default"
		if path != "" {
			name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		opts := replay.Options{
			PolicyName: name,
			Roles:      b.Roles,
			BlockSize:  b.BlockSize,
			TraceName:  traceName,
			Records:    records,
		}
		if disagg {
			opts.PrefillWorkers, opts.DecodeWorkers = f.prefill, f.decode
		} else {
			opts.Workers = f.workers
		}
		var perReq *os.File
		if f.perRequest != "" {
			if perReq, err = os.Create(f.perRequest); err != nil {
				return &exitError{code: 1, err: err}
			}
			opts.PerRequest = perReq
		}
		rep, err := replay.Run(cmd.Context(), opts)
		if perReq != nil {
			if cerr := perReq.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		reports = append(reports, rep)
	}
	out := cmd.OutOrStdout()
	if disagg {
		fmt.Fprintf(out, "trace %s: %d requests on %d prefill + %d decode simulated workers\n", traceName, len(records), f.prefill, f.decode)
	} else {
		fmt.Fprintf(out, "trace %s: %d requests on %d simulated workers\n", traceName, len(records), f.workers)
	}
	if err := replay.WriteTable(out, reports); err != nil {
		return err
	}
	if f.report != "" {
		var v any = reports[0]
		if len(reports) > 1 {
			v = reports
		}
		buf, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(f.report, append(buf, '\n'), 0o644); err != nil {
			return &exitError{code: 1, err: err}
		}
	}
	return nil
}

// loadTrace reads the trace at path, or the bundled conversation trace when
// path is empty.
func loadTrace(path string) ([]trace.Record, string, error) {
	if path == "" {
		b, err := bundled.ConversationTrace()
		if err != nil {
			return nil, "", err
		}
		recs, err := trace.ReadMooncake(bytes.NewReader(b), bundled.Name)
		return recs, bundled.Name + " (bundled)", err
	}
	recs, err := trace.ReadFile(path)
	return recs, filepath.Base(path), err
}

// loadPolicy loads the policy file at path (the default policy when empty),
// printing warnings to stderr. seed, when set, overrides router.seed; when
// neither gives one, replay.DefaultSeed seeds the policy, so a replay
// repeats exactly by default.
func loadPolicy(stderr io.Writer, path string, seed *int64) (*config.Bundle, error) {
	src, name := []byte(""), "default"
	if path != "" {
		var err error
		if src, err = os.ReadFile(path); err != nil {
			return nil, err
		}
		name = path
	}
	def := int64(replay.DefaultSeed)
	b, diags := config.LoadWith(name, src, catalog.Default(), config.Options{Seed: seed, DefaultSeed: &def})
	if len(diags) > 0 {
		fmt.Fprint(stderr, config.FormatDiagnostics(diags))
	}
	if diags.HasErrors() || b == nil {
		return nil, fmt.Errorf("%s: policy file has errors", name)
	}
	return b, nil
}
