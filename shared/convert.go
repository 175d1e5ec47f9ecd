package shared

// Conversions between the SDK's Go types and the generated
// switchyard.plugin.v1 messages on the plugin side: what a plugin decodes
// from the router and encodes for it. They live here, in one file, so plugin
// authors never see a generated type (as Nomad keeps its converters in
// plugins/device/util.go). The router's side is in internal/pluginclient;
// what both sides use (parameter values, int narrowing) is in
// package pluginwire (shared/pluginwire).

import (
	"fmt"
	"math"
	"time"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
	"github.com/switchyard-router/switchyard/shared/pluginwire"
)

// kindToProto maps a Kind to its enum; the numbering is the same.
func kindToProto(k Kind) pluginv1.Kind { return pluginv1.Kind(k) }

// inputsToProto: the wire bit set equals Inputs.
func inputsToProto(in Inputs) uint32 { return uint32(in & PluginInputs) }

// paramTypeToProto maps a ParamType to its enum; the numbering is the same.
func paramTypeToProto(t ParamType) pluginv1.ParamType { return pluginv1.ParamType(t) }

// typeToProto converts a TypeInfo for Describe (New does not travel).
func typeToProto(t *TypeInfo) (*pluginv1.ComponentType, error) {
	ct := &pluginv1.ComponentType{
		Name:   t.Name,
		Kind:   kindToProto(t.Kind),
		Inputs: inputsToProto(t.Inputs),
		Doc:    t.Doc,
		Params: make([]*pluginv1.ParamSpec, 0, len(t.Params)),
	}
	for _, p := range t.Params {
		ps := &pluginv1.ParamSpec{Name: p.Name, Type: paramTypeToProto(p.Type), Required: p.Required, Doc: p.Doc}
		if p.Default != nil {
			d, err := pluginwire.ValueToProto(p.Default)
			if err != nil {
				return nil, fmt.Errorf("type %q: parameter %q default: %w", t.Name, p.Name, err)
			}
			ps.Default = d
		}
		ct.Params = append(ct.Params, ps)
	}
	return ct, nil
}

// requestFromProto converts a wire Request into r (so a task can reuse one).
func requestFromProto(p *pluginv1.Request, r *Request) {
	*r = Request{
		ID:           p.GetId(),
		Model:        p.GetModel(),
		Role:         Role(p.GetRole()),
		PromptTokens: int(p.GetPromptTokens()),
		BlockSize:    int(p.GetBlockSize()),
		BlockHashes:  p.GetBlockHashes(),
		SessionID:    p.GetSessionId(),
		Priority:     int(p.GetPriority()),
		Metadata:     p.GetMetadata(),

		CachedPromptTokens: int(p.GetCachedPromptTokens()),
	}
}

// candidatesFromProto fills c from cols, reusing c's slices and *store for
// the labels' storage. Every non-empty column must have one entry per id;
// an empty column is a nil one. The label columns must add up: the counts
// sum to the number of keys and of values.
func candidatesFromProto(cols *pluginv1.Columns, c *Candidates, store *[]Label) error {
	if cols == nil {
		cols = &pluginv1.Columns{}
	}
	n := len(cols.Ids)
	check := func(name string, l int) error {
		if l != 0 && l != n {
			return fmt.Errorf("column %s has %d entries for %d rows", name, l, n)
		}
		return nil
	}
	for _, col := range [...]struct {
		name string
		l    int
	}{
		{"dp_ranks", len(cols.GetDpRanks())},
		{"active_requests", len(cols.GetActiveRequests())},
		{"load_available", len(cols.GetLoadAvailable())},
		{"load_active_prefill_tokens", len(cols.GetLoadActivePrefillTokens())},
		{"load_active_decode_blocks", len(cols.GetLoadActiveDecodeBlocks())},
		{"load_active_requests", len(cols.GetLoadActiveRequests())},
		{"load_kv_usage", len(cols.GetLoadKvUsage())},
		{"load_waiting", len(cols.GetLoadWaiting())},
		{"overlap_blocks", len(cols.GetOverlapBlocks())},
		{"total_kv_blocks", len(cols.GetTotalKvBlocks())},
		{"costs", len(cols.GetCosts())},
		{"names", len(cols.GetNames())},
		{"label_counts", len(cols.GetLabelCounts())},
	} {
		if err := check(col.name, col.l); err != nil {
			return err
		}
	}
	loadCols := [...]int{
		len(cols.GetLoadAvailable()), len(cols.GetLoadActivePrefillTokens()), len(cols.GetLoadActiveDecodeBlocks()),
		len(cols.GetLoadActiveRequests()), len(cols.GetLoadKvUsage()), len(cols.GetLoadWaiting()),
	}
	hasLoad := false
	for _, l := range loadCols {
		hasLoad = hasLoad || l != 0
	}
	if hasLoad {
		for _, l := range loadCols {
			if l != n {
				return fmt.Errorf("load columns have %v entries for %d rows; all six travel together", loadCols, n)
			}
		}
	}

	ids := pluginwire.GrowTo(c.IDs, n)
	for i, id := range cols.Ids {
		ids[i] = WorkerID(id)
	}
	*c = Candidates{IDs: ids, DPRanks: c.DPRanks, ActiveRequests: c.ActiveRequests, Load: c.Load,
		OverlapBlocks: c.OverlapBlocks, TotalKVBlocks: c.TotalKVBlocks, Costs: c.Costs, Names: c.Names, Labels: c.Labels}
	if err := labelsFromProto(cols, c, store); err != nil {
		return err
	}
	c.DPRanks = copyCol(c.DPRanks, cols.DpRanks)
	c.ActiveRequests = copyCol(c.ActiveRequests, cols.ActiveRequests)
	c.OverlapBlocks = copyCol(c.OverlapBlocks, cols.OverlapBlocks)
	c.TotalKVBlocks = copyCol(c.TotalKVBlocks, cols.TotalKvBlocks)
	c.Costs = copyCol(c.Costs, cols.Costs)
	if !hasLoad {
		c.Load = nil
		return nil
	}
	c.Load = pluginwire.GrowTo(c.Load, n)
	for i := range c.Load {
		kv, w := cols.LoadKvUsage[i], cols.LoadWaiting[i]
		c.Load[i] = Load{
			Available:           cols.LoadAvailable[i],
			ActivePrefillTokens: cols.LoadActivePrefillTokens[i],
			ActiveDecodeBlocks:  cols.LoadActiveDecodeBlocks[i],
			ActiveRequests:      cols.LoadActiveRequests[i],
			KVUsage:             kv,
			HasKVUsage:          !math.IsNaN(kv),
			Waiting:             w,
			HasWaiting:          w >= 0,
		}
		if !c.Load[i].HasKVUsage {
			c.Load[i].KVUsage = 0
		}
		if !c.Load[i].HasWaiting {
			c.Load[i].Waiting = 0
		}
	}
	return nil
}

// labelsFromProto fills c.Names and c.Labels from cols (nil when cols
// carries none), the labels' pairs in *store. Every row's labels must be
// there (2 refs a label, the counts adding up to the refs) and every ref
// an index into label_strings. Linear in the labels.
func labelsFromProto(cols *pluginv1.Columns, c *Candidates, store *[]Label) error {
	c.Names = copyCol(c.Names, cols.GetNames())
	counts, refs, strs := cols.GetLabelCounts(), cols.GetLabelRefs(), cols.GetLabelStrings()
	if len(counts) == 0 {
		if len(refs) != 0 {
			return fmt.Errorf("label_refs has %d entries without label_counts", len(refs))
		}
		c.Labels = nil
		return nil
	}
	if len(refs)%2 != 0 {
		return fmt.Errorf("label_refs has %d entries, not a key and a value for each label", len(refs))
	}
	*store = pluginwire.GrowTo(*store, len(refs)/2)
	pairs := *store
	for i := range pairs {
		k, v := refs[2*i], refs[2*i+1]
		if uint64(k) >= uint64(len(strs)) || uint64(v) >= uint64(len(strs)) {
			return fmt.Errorf("label_refs entry %d refers to string %d of %d label_strings", 2*i, max(k, v), len(strs))
		}
		pairs[i] = Label{Key: strs[k], Value: strs[v]}
	}
	c.Labels = pluginwire.GrowTo(c.Labels, len(counts))
	off := 0
	for i, n := range counts {
		if uint64(n) > uint64(len(pairs)-off) {
			return fmt.Errorf("label_counts add up to more than the %d labels of label_refs", len(pairs))
		}
		c.Labels[i] = Labels(pairs[off : off+int(n) : off+int(n)])
		off += int(n)
	}
	if off != len(pairs) {
		return fmt.Errorf("label_counts add up to %d labels, label_refs has %d", off, len(pairs))
	}
	return nil
}

// copyCol copies src into dst's storage; an empty src is a nil column.
func copyCol[T any](dst, src []T) []T {
	if len(src) == 0 {
		return nil
	}
	return append(dst[:0], src...)
}

// eventFromProto converts one wire event.
func eventFromProto(p *pluginv1.Event) Event {
	e := Event{
		Kind:          EventKind(p.GetKind()),
		RequestID:     p.GetRequestId(),
		Worker:        WorkerID(p.GetWorker()),
		HasWorker:     p.GetHasWorker(),
		ContextTokens: int64(min(p.GetContextTokens(), math.MaxInt64)),
		Reason:        p.GetReason(),
	}
	if ns := p.GetUnixNano(); ns != 0 {
		e.At = time.Unix(0, ns)
	}
	return e
}

// classificationToProto converts a Classify answer.
func classificationToProto(c Classification) *pluginv1.ClassifyResponse {
	r := &pluginv1.ClassifyResponse{
		Priority:             pluginwire.ClampI32(c.Priority),
		PolicyClass:          c.PolicyClass,
		SchedulingCostTokens: uint64(max(c.SchedulingCostTokens, 0)),
		Target:               uint64(c.Target),
		HasTarget:            c.HasTarget,
	}
	if !c.DueAt.IsZero() {
		r.DueUnixNano = c.DueAt.UnixNano()
	}
	return r
}

// workersFromProto converts a partition's worker list.
func workersFromProto(ws []*pluginv1.WorkerInfo) []WorkerInfo {
	out := make([]WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = WorkerInfo{ID: WorkerID(w.GetId()), DPRank: w.GetDpRank(), TotalKVBlocks: w.GetTotalKvBlocks()}
	}
	return out
}
