package pluginclient

// Conversions between the SDK's Go types and the generated
// switchyard.plugin.v1 messages on the router's side: what it encodes for a
// plugin and decodes from it. The plugin side's are in package shared
// (convert.go); what both sides use is in shared/pluginwire.

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/switchyard-router/switchyard/internal/untrusted"
	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// kindFromProto maps the enum to a Kind (the numbering is the same);
// unknown values become 0 (invalid).
func kindFromProto(k pluginv1.Kind) shared.Kind {
	if k < pluginv1.Kind_KIND_FILTER || k > pluginv1.Kind_KIND_CLASSIFIER {
		return 0
	}
	return shared.Kind(k)
}

// inputsFromProto: the wire bit set equals Inputs; unknown bits, and the
// in-process-only LATENCY, are dropped (shared.PluginInputs).
func inputsFromProto(in uint32) shared.Inputs { return shared.Inputs(in) & shared.PluginInputs }

// paramTypeFromProto maps the enum to a ParamType (the numbering is the
// same); unknown values become 0 (invalid).
func paramTypeFromProto(t pluginv1.ParamType) shared.ParamType {
	if t < pluginv1.ParamType_PARAM_TYPE_NUMBER || t > pluginv1.ParamType_PARAM_TYPE_NUMBER_LIST {
		return 0
	}
	return shared.ParamType(t)
}

// paramsToProto converts Params for a ConfigureRequest.
func paramsToProto(p shared.Params) (map[string]*pluginv1.Value, error) {
	if len(p) == 0 {
		return nil, nil
	}
	out := make(map[string]*pluginv1.Value, len(p))
	for name, v := range p {
		pv, err := pluginwire.ValueToProto(v)
		if err != nil {
			return nil, &shared.ParamError{Param: name, Err: err}
		}
		out[name] = pv
	}
	return out, nil
}

// typeFromProto converts a described type; New stays nil.
func typeFromProto(ct *pluginv1.ComponentType) (shared.TypeInfo, error) {
	t := shared.TypeInfo{
		Name:   ct.GetName(),
		Kind:   kindFromProto(ct.GetKind()),
		Inputs: inputsFromProto(ct.GetInputs()),
		Doc:    ct.GetDoc(),
	}
	if t.Kind == 0 {
		return shared.TypeInfo{}, fmt.Errorf("type %q: unknown kind %v", t.Name, ct.GetKind())
	}
	for _, ps := range ct.GetParams() {
		spec := shared.ParamSpec{Name: ps.GetName(), Type: paramTypeFromProto(ps.GetType()), Required: ps.GetRequired(), Doc: ps.GetDoc()}
		if spec.Type == 0 {
			return shared.TypeInfo{}, fmt.Errorf("type %q: parameter %q: unknown type %v", t.Name, spec.Name, ps.GetType())
		}
		if ps.Default != nil {
			d, err := pluginwire.ValueFromProto(ps.Default, ps.GetType())
			if err != nil {
				return shared.TypeInfo{}, fmt.Errorf("type %q: parameter %q default: %w", t.Name, spec.Name, err)
			}
			spec.Default = d
		}
		t.Params = append(t.Params, spec)
	}
	return t, nil
}

// requestIntoProto fills p from r (nil: an empty request), reusing p's
// block hash storage and copying what the caller owns.
func requestIntoProto(r *shared.Request, p *pluginv1.Request) {
	if r == nil {
		r = &shared.Request{}
	}
	p.Id, p.Model, p.Role = r.ID, r.Model, string(r.Role)
	p.PromptTokens, p.BlockSize = pluginwire.ClampU32(r.PromptTokens), pluginwire.ClampU32(r.BlockSize)
	p.BlockHashes = append(p.BlockHashes[:0], r.BlockHashes...)
	p.SessionId, p.Priority = r.SessionID, pluginwire.ClampI32(r.Priority)
	p.CachedPromptTokens = pluginwire.ClampU32(r.CachedPromptTokens)
	p.Metadata = nil
	if r.Metadata != nil {
		p.Metadata = maps.Clone(r.Metadata)
	}
}

// CandidatesToProto fills cols from c as the router sends a task's rows
// (and `router plugins check` does): only the non-nil columns travel.
// Load travels as parallel columns, with NaN kv_usage and -1 waiting when
// the engine has not reported them; labels as a count per row and the
// rows' (key, value) indices into the distinct strings (labelsToProto). cols
// is reset first, its slices reused: once they have grown, filling them
// allocates nothing (names and labels share the router's strings).
func CandidatesToProto(c *shared.Candidates, cols *pluginv1.Columns) {
	n := c.Len()
	cols.Ids = cols.Ids[:0]
	for _, id := range c.IDs {
		cols.Ids = append(cols.Ids, uint64(id))
	}
	cols.DpRanks = append(cols.DpRanks[:0], c.DPRanks...)
	cols.ActiveRequests = append(cols.ActiveRequests[:0], c.ActiveRequests...)
	cols.LoadAvailable = cols.LoadAvailable[:0]
	cols.LoadActivePrefillTokens = cols.LoadActivePrefillTokens[:0]
	cols.LoadActiveDecodeBlocks = cols.LoadActiveDecodeBlocks[:0]
	cols.LoadActiveRequests = cols.LoadActiveRequests[:0]
	cols.LoadKvUsage = cols.LoadKvUsage[:0]
	cols.LoadWaiting = cols.LoadWaiting[:0]
	if c.Load != nil {
		cols.LoadAvailable = pluginwire.GrowTo(cols.LoadAvailable, n)
		cols.LoadActivePrefillTokens = pluginwire.GrowTo(cols.LoadActivePrefillTokens, n)
		cols.LoadActiveDecodeBlocks = pluginwire.GrowTo(cols.LoadActiveDecodeBlocks, n)
		cols.LoadActiveRequests = pluginwire.GrowTo(cols.LoadActiveRequests, n)
		cols.LoadKvUsage = pluginwire.GrowTo(cols.LoadKvUsage, n)
		cols.LoadWaiting = pluginwire.GrowTo(cols.LoadWaiting, n)
		for i, l := range c.Load {
			cols.LoadAvailable[i] = l.Available
			cols.LoadActivePrefillTokens[i] = l.ActivePrefillTokens
			cols.LoadActiveDecodeBlocks[i] = l.ActiveDecodeBlocks
			cols.LoadActiveRequests[i] = l.ActiveRequests
			cols.LoadKvUsage[i] = math.NaN()
			if l.HasKVUsage {
				cols.LoadKvUsage[i] = l.KVUsage
			}
			cols.LoadWaiting[i] = -1
			if l.HasWaiting {
				cols.LoadWaiting[i] = l.Waiting
			}
		}
	}
	cols.OverlapBlocks = append(cols.OverlapBlocks[:0], c.OverlapBlocks...)
	cols.TotalKvBlocks = append(cols.TotalKvBlocks[:0], c.TotalKVBlocks...)
	cols.Costs = append(cols.Costs[:0], c.Costs...)
	cols.Names = append(cols.Names[:0], c.Names...)
	labelsToProto(c.Labels, cols)
}

// labelTables are the string-to-index maps labelsToProto dedupes label
// strings with, pooled: cleared, a map keeps its buckets, so a task's
// labels cost no allocation once the map has grown.
var labelTables = sync.Pool{New: func() any { return make(map[string]uint32) }}

// labelsToProto fills the label columns from ls (none when ls is nil):
// per row its count, per label a key and a value index into
// label_strings, which holds each distinct string once. Workers share
// keys (and often values), so the plugin decodes a few strings rather
// than two per label. Linear in the labels.
func labelsToProto(ls []shared.Labels, cols *pluginv1.Columns) {
	cols.LabelCounts, cols.LabelRefs, cols.LabelStrings = cols.LabelCounts[:0], cols.LabelRefs[:0], cols.LabelStrings[:0]
	if ls == nil {
		return
	}
	idx := labelTables.Get().(map[string]uint32)
	clear(idx)
	ref := func(s string) uint32 {
		i, ok := idx[s]
		if !ok {
			i = uint32(len(cols.LabelStrings))
			idx[s] = i
			cols.LabelStrings = append(cols.LabelStrings, s)
		}
		return i
	}
	for _, row := range ls {
		cols.LabelCounts = append(cols.LabelCounts, uint32(len(row)))
		for _, l := range row {
			cols.LabelRefs = append(cols.LabelRefs, ref(l.Key), ref(l.Value))
		}
	}
	labelTables.Put(idx)
}

// resultFromProto converts a DecideResult for the caller of a task of
// stages. An empty kept list without filtered_by means every row (Kept
// nil). filtered_by is kept as it is when it names one of stages'
// instances (the router's own name), else bounded and escaped
// (untrusted.Text, untrusted.MaxClient): it may end up in a client's
// answer, and CheckResult refuses it anyway.
func resultFromProto(r *pluginv1.DecideResult, stages []Stage) TaskResult {
	res := TaskResult{Picked: int(r.GetPicked()), FilteredBy: r.GetFilteredBy()}
	if by := res.FilteredBy; by != "" && !slices.ContainsFunc(stages, func(st Stage) bool { return st.Instance == by }) {
		res.FilteredBy = untrusted.Text(by, untrusted.MaxClient)
	}
	if len(r.GetKept()) > 0 || res.FilteredBy != "" {
		res.Kept = r.GetKept()
		if res.Kept == nil {
			res.Kept = []uint32{}
		}
	}
	if len(r.GetCosts()) > 0 {
		res.Costs = r.GetCosts()
	}
	return res
}

// eventToProto converts one lifecycle event into p.
func eventToProto(e *shared.Event, p *pluginv1.Event) {
	p.RequestId, p.Kind = e.RequestID, pluginv1.EventKind(e.Kind)
	p.Worker, p.HasWorker = uint64(e.Worker), e.HasWorker
	p.ContextTokens = uint64(max(e.ContextTokens, 0))
	p.Reason = e.Reason
	p.UnixNano = 0
	if !e.At.IsZero() {
		p.UnixNano = e.At.UnixNano()
	}
}

// classificationFromProto converts a Classify answer; its policy class is
// bounded and escaped (untrusted.MaxClient).
func classificationFromProto(r *pluginv1.ClassifyResponse) shared.Classification {
	c := shared.Classification{
		Priority: int(r.GetPriority()),
		// Bounded: an unknown class is quoted in the client's answer.
		PolicyClass:          untrusted.Text(r.GetPolicyClass(), untrusted.MaxClient),
		SchedulingCostTokens: int64(min(r.GetSchedulingCostTokens(), math.MaxInt64)),
		Target:               shared.WorkerID(r.GetTarget()),
		HasTarget:            r.GetHasTarget(),
	}
	if ns := r.GetDueUnixNano(); ns != 0 {
		c.DueAt = time.Unix(0, ns)
	}
	return c
}

// workersToProto converts a partition's worker list.
func workersToProto(ws []shared.WorkerInfo) []*pluginv1.WorkerInfo {
	out := make([]*pluginv1.WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = &pluginv1.WorkerInfo{Id: uint64(w.ID), DpRank: w.DPRank, TotalKvBlocks: w.TotalKVBlocks}
	}
	return out
}
