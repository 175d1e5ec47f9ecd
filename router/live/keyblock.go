package live

import (
	"sync"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/shared"
)

// Engines is what the engines report that a request's routing key
// depends on: the contract with router/workers' discovery (issue #26),
// which *workers.Manager meets once it reads them. A Runtime takes it from
// Options.Engines, else from Options.Workers when that implements it;
// without it block sizes come from the fleet (the members' engine block
// sizes) and no model is an adapter.
type Engines interface {
	// BlockSize returns the KV block size in tokens that the engines
	// serving model report (vLLM's cache_config_info block_size, SGLang's
	// page_size); false when none reported one.
	BlockSize(model string) (tokens int, ok bool)
	// Parent returns the base model of model when model is a LoRA
	// adapter (vLLM's GET /v1/models parent), else "".
	Parent(model string) string
}

// fleetEngines answers Engines from the fleet: a model's block size is
// the smallest engine block size among its members (the finest key: a
// member of a larger block still counts its cached tokens exactly, as
// floor(n·E / size) blocks of the request's size); no adapters.
type fleetEngines struct{ r *router.Router }

func (f fleetEngines) BlockSize(model string) (int, bool) {
	best := 0
	for _, role := range []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode} {
		for _, w := range f.r.Workers(model, role) {
			if e := int(w.EngineBlockSize); e > 0 && e <= 1<<30 && (best == 0 || e < best) {
				best = e
			}
		}
	}
	return best, best > 0
}

func (fleetEngines) Parent(string) string { return "" }

// keyBlockSize returns the block size model's requests are keyed at:
// router.block_size when the policy file sets it (warned about once per
// model when its engines report another), else the engines' own block
// size for model (a LoRA adapter's base model's when its own is unknown),
// else the router's default (config.DefaultBlockSize, 512). parent is
// model's base model ("" for none).
func (rt *Runtime) keyBlockSize(model, parent string) int {
	engine, ok := rt.engines.BlockSize(model)
	if (!ok || engine <= 0) && parent != "" {
		engine, ok = rt.engines.BlockSize(parent)
	}
	if !ok || engine <= 0 || engine > 1<<30 {
		engine = 0
	}
	if o := rt.r.BlockSizeOverride(); o > 0 {
		if engine > 0 && engine != o {
			rt.warnBlockSize(model, o, engine)
		}
		return o
	}
	if engine > 0 {
		return engine
	}
	return rt.r.BlockSize()
}

// warnBlockSize logs once per model that router.block_size overrides the
// block size its engines report. Models are those engines report a size
// for: bounded by the fleet's, not by clients'.
func (rt *Runtime) warnBlockSize(model string, override, engine int) {
	if _, seen := rt.warnedBS.LoadOrStore(model, struct{}{}); seen {
		return
	}
	rt.log.Warn("router.block_size overrides the engines' KV block size: prefix keys and capacities are in blocks of router.block_size, so a cached prefix counts only in whole blocks of it",
		"model", model, "router_block_size", override, "engine_block_size", engine)
}

// warnedOnce is the set of models warnBlockSize warned about.
type warnedOnce = sync.Map
