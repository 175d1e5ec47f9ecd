package plugincheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/router/loader"
	"github.com/switchyard-router/switchyard/router/replay"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/trace"
	"github.com/switchyard-router/switchyard/shared"
)

// BundledTrace is the Options.Replay value (and `--replay` without a
// value) naming the trace `router replay` replays by default: the bundled
// Mooncake conversation trace (router/trace).
const BundledTrace = "default"

// DefaultReplayLimit is how many requests of the trace the replay check
// replays when Options.ReplayLimit is 0: enough for every decision type
// to decide a few hundred times over 8 workers, in a second or two of CPU.
const DefaultReplayLimit = 200

// replayFallback is the picker type of the replay policies' fallback: a
// built-in type (router/catalog), so a failing plugin falls back as it
// would in serve.
const replayFallback = "least-loaded"

// checkReplay replays the first limit requests of the trace o.Replay names
// (BundledTrace: the bundled one) on replay.DefaultWorkers simulated
// workers, once per decision type of types: each through a policy file of
// its own (written to a temporary directory) with a plugin block starting
// the plugin as o.Plugin does, the type as its only filter (then min-cost
// picks), its only scorer (weight 1, then min-cost), or its picker, the
// --config values its schema declares, and fallback least-loaded. As
// `router replay --fail-on-fallback`, a replay in which any decision was
// made by the fallback fails, with `router replay`'s own line naming the
// plugin, the causes and the first error (report.WriteFallbacks). The
// replay's plugins are processes of their own, started and stopped by the
// replay (router/replay, replay.Sweep).
func checkReplay(ctx context.Context, o Options, types []shared.TypeInfo) []Result {
	limit := o.ReplayLimit
	if limit <= 0 {
		limit = DefaultReplayLimit
	}
	path := o.Replay
	if path == BundledTrace {
		path = ""
	}
	var deciders []shared.TypeInfo
	for _, t := range types {
		if t.Kind >= shared.KindFilter && t.Kind <= shared.KindPicker {
			deciders = append(deciders, t)
		}
	}
	if len(deciders) == 0 {
		return []Result{skip("replay", "no filter, scorer or picker type to replay")}
	}
	tr, err := trace.Open(path, "", nil, limit, trace.DefaultHold)
	if err != nil {
		return []Result{fail("replay", "a trace to replay", err.Error())}
	}
	dir, err := os.MkdirTemp("", "sy-check-replay-")
	if err != nil {
		return []Result{fail("replay", "a temporary directory for the policy files", err.Error())}
	}
	defer func() { _ = os.RemoveAll(dir) }()
	var out []Result
	for _, t := range deciders {
		out = append(out, replayType(ctx, o, tr, dir, t, limit))
	}
	return out
}

// replayType replays tr through a policy deciding with t (checkReplay).
func replayType(ctx context.Context, o Options, tr *trace.Opened, dir string, t shared.TypeInfo, limit int) Result {
	name := fmt.Sprintf("replay %q", t.Name)
	src, err := replayPolicy(o, t)
	if err != nil {
		return fail(name, "a policy file using the type", err.Error())
	}
	// The row's label, which router replay's fallback line quotes, is the
	// file's name: "check-TYPE" (a type name is letters, digits, '_', '.'
	// and '-': catalog.ValidName).
	file := filepath.Join(dir, "check-"+t.Name+".hcl")
	if err := os.WriteFile(file, src, 0o600); err != nil {
		return fail(name, "a policy file using the type", err.Error())
	}
	var diags bytes.Buffer
	sweep := &replay.Sweep{
		Trace:    tr,
		Policies: []string{file},
		Fleets:   []replay.Fleet{{Workers: replay.DefaultWorkers}},
		Warnings: io.Discard,
		Load: func(ctx context.Context, path string, lo loader.LoadOptions, _ io.Writer) (*loader.Bundle, error) {
			lo.Logger = o.Logger
			b, ds := loader.LoadBundle(ctx, path, lo)
			if ds.HasErrors() || b == nil {
				diags.WriteString(strings.TrimSpace(config.FormatDiagnostics(ds)))
				return nil, fmt.Errorf("the policy file using the type does not load: %s", diags.String())
			}
			return b, nil
		},
	}
	res, err := sweep.Run(ctx)
	if err != nil {
		return fail(name, fmt.Sprintf("a replay of %d requests", limit), err.Error())
	}
	var fellBack, selections int64
	var lines bytes.Buffer
	for _, rep := range res.Reports {
		fellBack += rep.Fallbacks
		selections += rep.Selections
		_ = report.WriteFallbacks(&lines, rep)
	}
	if fellBack > 0 {
		return fail(name, "no selection decided by the fallback (router replay --fail-on-fallback)",
			fmt.Sprintf("%d of %d selections fell back: %s", fellBack, selections, strings.TrimSpace(lines.String())))
	}
	return pass(name, fmt.Sprintf("%d requests of %s, %d selections on %d workers, none fell back", tr.Requests, tr.Name, selections, replay.DefaultWorkers))
}

// replayPolicy is the policy file replayType replays: o.Plugin's block,
// and one policy deciding with t and the --config values t declares.
func replayPolicy(o Options, t shared.TypeInfo) ([]byte, error) {
	f := hclwrite.NewEmptyFile()
	body := f.Body()
	pb := body.AppendNewBlock("plugin", []string{o.Plugin.Name}).Body()
	command := o.Plugin.Path
	if command == "" {
		command = o.Plugin.Command
	}
	if abs, err := filepath.Abs(command); err == nil && strings.ContainsRune(command, filepath.Separator) {
		command = abs
	}
	pb.SetAttributeValue("command", cty.StringVal(command))
	if len(o.Plugin.Args) > 0 {
		pb.SetAttributeValue("args", strings2cty(o.Plugin.Args))
	}
	if len(o.Plugin.Env) > 0 {
		env := make(map[string]cty.Value, len(o.Plugin.Env))
		for k, v := range o.Plugin.Env {
			env[k] = cty.StringVal(v)
		}
		pb.SetAttributeValue("env", cty.MapVal(env))
	}
	if len(o.Plugin.PassEnv) > 0 {
		pb.SetAttributeValue("pass_env", strings2cty(o.Plugin.PassEnv))
	}
	if o.Plugin.StartTimeout > 0 {
		pb.SetAttributeValue("start_timeout", cty.StringVal(o.Plugin.StartTimeout.String()))
	}
	policy := body.AppendNewBlock("policy", []string{"check"}).Body()
	block := policy.AppendNewBlock(t.Kind.String(), []string{"checked"}).Body()
	block.SetAttributeValue("type", cty.StringVal(t.Name))
	for _, p := range t.Params {
		s, ok := o.Config[p.Name]
		if !ok {
			continue
		}
		v, err := parseParamValue(p.Type, s)
		if err != nil {
			return nil, fmt.Errorf("--config %s=%q: %w", p.Name, s, err)
		}
		block.SetAttributeValue(p.Name, ctyOf(v))
	}
	if t.Kind != shared.KindPicker {
		policy.AppendNewBlock("picker", []string{"pick"}).Body().SetAttributeValue("type", cty.StringVal("min-cost"))
	}
	policy.SetAttributeValue("fallback", cty.StringVal(replayFallback))
	body.AppendNewBlock("worker_selection", nil).Body().SetAttributeValue("aggregated", cty.StringVal("check"))
	return f.Bytes(), nil
}

// strings2cty is ss as an HCL list of strings.
func strings2cty(ss []string) cty.Value {
	vs := make([]cty.Value, len(ss))
	for i, s := range ss {
		vs[i] = cty.StringVal(s)
	}
	return cty.ListVal(vs)
}

// ctyOf is a parameter value (parseParamValue's) as a policy file writes
// it: a duration as its Go string.
func ctyOf(v any) cty.Value {
	switch v := v.(type) {
	case float64:
		return cty.NumberFloatVal(v)
	case int64:
		return cty.NumberIntVal(v)
	case bool:
		return cty.BoolVal(v)
	case time.Duration:
		return cty.StringVal(v.String())
	case string:
		return cty.StringVal(v)
	}
	return cty.NullVal(cty.String)
}
