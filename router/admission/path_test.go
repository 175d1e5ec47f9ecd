package admission

import (
	"testing"

	"github.com/switchyard-router/switchyard/shared"
)

func TestPathHops(t *testing.T) {
	if Aggregated.Len() != 1 || Disaggregated.Len() != 2 {
		t.Fatalf("hops: aggregated %d, disaggregated %d; want 1 and 2", Aggregated.Len(), Disaggregated.Len())
	}
	base := &shared.Request{ID: "r", Model: "m", Role: shared.RoleAggregated, PromptTokens: 1000, BlockHashes: []uint64{1, 2},
		SessionID: "s", Metadata: map[string]string{"x-priority": "3"}}
	for _, c := range []struct {
		path     Path
		hop      int
		role     shared.Role
		hashes   bool
		ctx      int64 // context tokens at completion, 1000-token prompt, 50-token answer
		endsAt1  bool  // the request is over when this hop completes, 1-token answer
		endsAt50 bool  // 50-token answer
	}{
		{Aggregated, 0, shared.RoleAggregated, true, 1050, true, true},
		{Disaggregated, 0, shared.RolePrefill, true, 1001, true, false},
		{Disaggregated, 1, shared.RoleDecode, false, 1050, true, true},
	} {
		h := c.path.Hop(c.hop)
		req := h.Request(base)
		if req == base || req.Role != c.role || (req.BlockHashes != nil) != c.hashes || req.ID != "r" || req.Model != "m" ||
			req.PromptTokens != 1000 || req.SessionID != "s" || req.Metadata["x-priority"] != "3" {
			t.Errorf("path %d hop %d: request %+v", c.path, c.hop, req)
		}
		if got := h.ContextTokens(1000, 50); got != c.ctx {
			t.Errorf("path %d hop %d: context tokens %d, want %d", c.path, c.hop, got, c.ctx)
		}
		if h.Ends(1) != c.endsAt1 || h.Ends(50) != c.endsAt50 {
			t.Errorf("path %d hop %d: ends with 1 token %v, with 50 %v; want %v, %v", c.path, c.hop, h.Ends(1), h.Ends(50), c.endsAt1, c.endsAt50)
		}
	}
	if base.Role != shared.RoleAggregated || len(base.BlockHashes) != 2 {
		t.Errorf("Request modified its base: %+v", base)
	}
}
