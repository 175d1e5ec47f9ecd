package shared

// Conversions between the SDK's Go types and the generated
// switchyard.plugin.v1 messages. They live here, in one file, so plugin
// authors never see a generated type (as Nomad keeps its converters in
// plugins/device/util.go).

import (
	"fmt"
	"maps"
	"math"
	"time"

	pluginv1 "github.com/switchyard-router/switchyard/pluginproto/switchyard/plugin/v1"
)

// kindToProto maps a Kind to its enum; the numbering is the same.
func kindToProto(k Kind) pluginv1.Kind { return pluginv1.Kind(k) }

// kindFromProto maps the enum back; unknown values become 0 (invalid).
func kindFromProto(k pluginv1.Kind) Kind {
	if k < pluginv1.Kind_KIND_FILTER || k > pluginv1.Kind_KIND_CLASSIFIER {
		return 0
	}
	return Kind(k)
}

// inputsToProto and inputsFromProto: the wire bit set equals Inputs.
func inputsToProto(in Inputs) uint32   { return uint32(in) }
func inputsFromProto(in uint32) Inputs { return Inputs(in) & AllInputs }

func paramTypeToProto(t ParamType) pluginv1.ParamType { return pluginv1.ParamType(t) }

func paramTypeFromProto(t pluginv1.ParamType) ParamType {
	if t < pluginv1.ParamType_PARAM_TYPE_NUMBER || t > pluginv1.ParamType_PARAM_TYPE_DURATION {
		return 0
	}
	return ParamType(t)
}

// valueToProto converts one parameter value. It accepts the Go types Params
// documents (float64, int64, bool, string, time.Duration) and, for
// convenience, int.
func valueToProto(v any) (*pluginv1.Value, error) {
	switch v := v.(type) {
	case float64:
		return &pluginv1.Value{Kind: &pluginv1.Value_Number{Number: v}}, nil
	case int64:
		return &pluginv1.Value{Kind: &pluginv1.Value_Int{Int: v}}, nil
	case int:
		return &pluginv1.Value{Kind: &pluginv1.Value_Int{Int: int64(v)}}, nil
	case bool:
		return &pluginv1.Value{Kind: &pluginv1.Value_Bool{Bool: v}}, nil
	case string:
		return &pluginv1.Value{Kind: &pluginv1.Value_String_{String_: v}}, nil
	case time.Duration:
		return &pluginv1.Value{Kind: &pluginv1.Value_DurationNs{DurationNs: int64(v)}}, nil
	}
	return nil, fmt.Errorf("unsupported parameter value type %T", v)
}

// valueFromProto converts a wire value to the Go type of want. A value of
// another kind is an error naming both; an Int is accepted for a Number.
func valueFromProto(v *pluginv1.Value, want ParamType) (any, error) {
	switch k := v.GetKind().(type) {
	case *pluginv1.Value_Number:
		if want == Number {
			return k.Number, nil
		}
	case *pluginv1.Value_Int:
		switch want {
		case Int:
			return k.Int, nil
		case Number:
			return float64(k.Int), nil
		}
	case *pluginv1.Value_Bool:
		if want == Bool {
			return k.Bool, nil
		}
	case *pluginv1.Value_String_:
		if want == String {
			return k.String_, nil
		}
	case *pluginv1.Value_DurationNs:
		if want == Duration {
			return time.Duration(k.DurationNs), nil
		}
	case nil:
		return nil, fmt.Errorf("empty value, want %s", want)
	}
	return nil, fmt.Errorf("got a %s value, want %s", valueKindName(v), want)
}

func valueKindName(v *pluginv1.Value) string {
	switch v.GetKind().(type) {
	case *pluginv1.Value_Number:
		return Number.String()
	case *pluginv1.Value_Int:
		return Int.String()
	case *pluginv1.Value_Bool:
		return Bool.String()
	case *pluginv1.Value_String_:
		return String.String()
	case *pluginv1.Value_DurationNs:
		return Duration.String()
	}
	return "empty"
}

// paramsToProto converts Params for a ConfigureRequest.
func paramsToProto(p Params) (map[string]*pluginv1.Value, error) {
	if len(p) == 0 {
		return nil, nil
	}
	out := make(map[string]*pluginv1.Value, len(p))
	for name, v := range p {
		pv, err := valueToProto(v)
		if err != nil {
			return nil, &ParamError{Param: name, Err: err}
		}
		out[name] = pv
	}
	return out, nil
}

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
			d, err := valueToProto(p.Default)
			if err != nil {
				return nil, fmt.Errorf("type %q: parameter %q default: %w", t.Name, p.Name, err)
			}
			ps.Default = d
		}
		ct.Params = append(ct.Params, ps)
	}
	return ct, nil
}

// typeFromProto converts a described type; New stays nil.
func typeFromProto(ct *pluginv1.ComponentType) (TypeInfo, error) {
	t := TypeInfo{
		Name:   ct.GetName(),
		Kind:   kindFromProto(ct.GetKind()),
		Inputs: inputsFromProto(ct.GetInputs()),
		Doc:    ct.GetDoc(),
	}
	if t.Kind == 0 {
		return TypeInfo{}, fmt.Errorf("type %q: unknown kind %v", t.Name, ct.GetKind())
	}
	for _, ps := range ct.GetParams() {
		spec := ParamSpec{Name: ps.GetName(), Type: paramTypeFromProto(ps.GetType()), Required: ps.GetRequired(), Doc: ps.GetDoc()}
		if spec.Type == 0 {
			return TypeInfo{}, fmt.Errorf("type %q: parameter %q: unknown type %v", t.Name, spec.Name, ps.GetType())
		}
		if ps.Default != nil {
			d, err := valueFromProto(ps.Default, spec.Type)
			if err != nil {
				return TypeInfo{}, fmt.Errorf("type %q: parameter %q default: %w", t.Name, spec.Name, err)
			}
			spec.Default = d
		}
		t.Params = append(t.Params, spec)
	}
	return t, nil
}

// clampU32 and clampI32 narrow ints for the wire.
func clampU32(v int) uint32 {
	switch {
	case v < 0:
		return 0
	case uint64(v) > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(v)
}

func clampI32(v int) int32 {
	switch {
	case v < math.MinInt32:
		return math.MinInt32
	case v > math.MaxInt32:
		return math.MaxInt32
	}
	return int32(v)
}

// requestIntoProto fills p from r (nil: an empty request), reusing p's
// block hash storage and copying what the caller owns.
func requestIntoProto(r *Request, p *pluginv1.Request) {
	if r == nil {
		r = &Request{}
	}
	p.Id, p.Model, p.Role = r.ID, r.Model, string(r.Role)
	p.PromptTokens, p.BlockSize = clampU32(r.PromptTokens), clampU32(r.BlockSize)
	p.BlockHashes = append(p.BlockHashes[:0], r.BlockHashes...)
	p.SessionId, p.Priority = r.SessionID, clampI32(r.Priority)
	p.CachedPromptTokens = clampU32(r.CachedPromptTokens)
	p.Metadata = nil
	if r.Metadata != nil {
		p.Metadata = maps.Clone(r.Metadata)
	}
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

// candidatesToProto fills cols from c: only the non-nil columns travel.
// Load travels as parallel columns, with NaN kv_usage and -1 waiting when
// the engine has not reported them. cols is reset first, its slices reused.
func candidatesToProto(c *Candidates, cols *pluginv1.Columns) {
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
		cols.LoadAvailable = growTo(cols.LoadAvailable, n)
		cols.LoadActivePrefillTokens = growTo(cols.LoadActivePrefillTokens, n)
		cols.LoadActiveDecodeBlocks = growTo(cols.LoadActiveDecodeBlocks, n)
		cols.LoadActiveRequests = growTo(cols.LoadActiveRequests, n)
		cols.LoadKvUsage = growTo(cols.LoadKvUsage, n)
		cols.LoadWaiting = growTo(cols.LoadWaiting, n)
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
}

// candidatesFromProto fills c from cols, reusing c's slices. Every non-empty
// column must have one entry per id; an empty column is a nil one.
func candidatesFromProto(cols *pluginv1.Columns, c *Candidates) error {
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

	ids := growTo(c.IDs, n)
	for i, id := range cols.Ids {
		ids[i] = WorkerID(id)
	}
	*c = Candidates{IDs: ids, DPRanks: c.DPRanks, ActiveRequests: c.ActiveRequests, Load: c.Load,
		OverlapBlocks: c.OverlapBlocks, TotalKVBlocks: c.TotalKVBlocks, Costs: c.Costs}
	c.DPRanks = copyCol(c.DPRanks, cols.DpRanks)
	c.ActiveRequests = copyCol(c.ActiveRequests, cols.ActiveRequests)
	c.OverlapBlocks = copyCol(c.OverlapBlocks, cols.OverlapBlocks)
	c.TotalKVBlocks = copyCol(c.TotalKVBlocks, cols.TotalKvBlocks)
	c.Costs = copyCol(c.Costs, cols.Costs)
	if !hasLoad {
		c.Load = nil
		return nil
	}
	c.Load = growTo(c.Load, n)
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

// copyCol copies src into dst's storage; an empty src is a nil column.
func copyCol[T any](dst, src []T) []T {
	if len(src) == 0 {
		return nil
	}
	return append(dst[:0], src...)
}

// growTo returns b with length n, reallocating only when too small.
func growTo[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// resultFromProto converts a DecideResult for the caller. An empty kept
// list without filtered_by means every row (Kept nil).
func resultFromProto(r *pluginv1.DecideResult) TaskResult {
	res := TaskResult{Picked: int(r.GetPicked()), FilteredBy: r.GetFilteredBy()}
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
func eventToProto(e *Event, p *pluginv1.Event) {
	p.RequestId, p.Kind = e.RequestID, pluginv1.EventKind(e.Kind)
	p.Worker, p.HasWorker = uint64(e.Worker), e.HasWorker
	p.ContextTokens = uint64(max(e.ContextTokens, 0))
	p.Reason = e.Reason
	p.UnixNano = 0
	if !e.At.IsZero() {
		p.UnixNano = e.At.UnixNano()
	}
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

// classificationToProto and classificationFromProto convert a Classify
// answer.
func classificationToProto(c Classification) *pluginv1.ClassifyResponse {
	r := &pluginv1.ClassifyResponse{
		Priority:             clampI32(c.Priority),
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

func classificationFromProto(r *pluginv1.ClassifyResponse) Classification {
	c := Classification{
		Priority:             int(r.GetPriority()),
		PolicyClass:          r.GetPolicyClass(),
		SchedulingCostTokens: int64(min(r.GetSchedulingCostTokens(), math.MaxInt64)),
		Target:               WorkerID(r.GetTarget()),
		HasTarget:            r.GetHasTarget(),
	}
	if ns := r.GetDueUnixNano(); ns != 0 {
		c.DueAt = time.Unix(0, ns)
	}
	return c
}

// workersToProto and workersFromProto convert a partition's worker list.
func workersToProto(ws []WorkerInfo) []*pluginv1.WorkerInfo {
	out := make([]*pluginv1.WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = &pluginv1.WorkerInfo{Id: uint64(w.ID), DpRank: w.DPRank, TotalKvBlocks: w.TotalKVBlocks}
	}
	return out
}

func workersFromProto(ws []*pluginv1.WorkerInfo) []WorkerInfo {
	out := make([]WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = WorkerInfo{ID: WorkerID(w.GetId()), DPRank: w.GetDpRank(), TotalKVBlocks: w.GetTotalKvBlocks()}
	}
	return out
}
