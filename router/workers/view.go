package workers

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// BlockSize returns the KV block size, in tokens, that the engines of
// model's ready workers report (fleet.Spec.EngineBlockSize: vLLM's
// cache_config_info block_size, SGLang's /server_info kv_events block_size
// or page_size); ok is false when none of them reports one (no ready
// worker serves model, or their engines say nothing of it).
//
// When the engines disagree the smallest size is returned: engines' block
// sizes are powers of two in practice, so the smallest divides the others
// and a prompt keyed at it can be regrouped into any other engine's
// blocks, while a key at a larger size would miss the tail of a prefix a
// smaller-block engine holds. The disagreement is logged at warn once,
// with every size, until the sizes change. (router.block_size, when set,
// overrides the returned size where requests are keyed: router/live
// warns about that difference.)
//
// It reads a summary rebuilt when membership or models change, without
// taking the Manager's lock: cheap enough to call per request.
func (m *Manager) BlockSize(model string) (tokens int, ok bool) {
	tokens, ok = m.view.Load().blockSize[model]
	return tokens, ok
}

// Parent returns the base model of model when model is a LoRA adapter
// (the "parent" of its card in the engine's GET /v1/models, as vLLM lists
// adapters); "" for a base model, a model no configured worker serves, or
// one whose engines do not say. See ModelCards for which worker's card
// counts. Like BlockSize, it does not take the Manager's lock.
func (m *Manager) Parent(model string) string {
	return m.view.Load().cards[model].Parent
}

// ModelCards returns a card for every model the configured workers serve
// (Models), sorted by id: the card of the first ready worker, in name
// order, whose engine lists the model, else the first such worker that
// is not ready; a model no engine lists (a block's models naming one the
// engine does not) has a card with its id only. The slice is the
// caller's.
func (m *Manager) ModelCards() []ModelCard {
	return slices.Clone(m.view.Load().list)
}

// rebuildLocked recomputes the view from the entries and logs the block
// size warnings. Work is linear in the workers' models and ranks (plus
// sorting the names).
func (m *Manager) rebuildLocked() {
	v := &view{blockSize: map[string]int{}, cards: map[string]ModelCard{}, urls: make(map[string]string, len(m.entries)), entries: maps.Clone(m.entries)}
	names := slices.Sorted(maps.Keys(m.entries))
	for _, name := range names {
		v.urls[name] = m.entries[name].cfg.URL
	}
	sizes := map[string][]int{}
	carded := map[string]bool{} // models whose card came from an engine
	for _, ready := range []bool{true, false} {
		for _, name := range names {
			e := m.entries[name]
			if e.ready != ready {
				continue
			}
			models, _ := e.modelsLocked()
			for _, id := range models {
				if carded[id] {
					continue
				}
				if i, found := slices.BinarySearchFunc(e.cards, id, func(c ModelCard, id string) int { return strings.Compare(c.ID, id) }); found {
					v.cards[id], carded[id] = e.cards[i], true
				} else if _, seen := v.cards[id]; !seen {
					v.cards[id] = ModelCard{ID: id}
				}
			}
			if !ready {
				continue
			}
			for _, rs := range e.ranks {
				if rs.member == nil || rs.member.EngineBlockSize <= 0 {
					continue
				}
				bs := int(rs.member.EngineBlockSize)
				for _, id := range models {
					if !slices.Contains(sizes[id], bs) {
						sizes[id] = append(sizes[id], bs)
					}
				}
			}
		}
	}
	for id, ss := range sizes {
		slices.Sort(ss)
		v.blockSize[id] = ss[0]
		if len(ss) > 1 {
			key := fmt.Sprint(ss)
			if m.warnedSizes[id] != key {
				m.log.Warn("the engines serving a model report different block sizes; its prefix keys use the smallest",
					"model", id, "block_sizes", ss, "block_size", ss[0])
				m.warnedSizes[id] = key
			}
		} else {
			delete(m.warnedSizes, id)
		}
	}
	for id := range m.warnedSizes {
		if _, ok := sizes[id]; !ok {
			delete(m.warnedSizes, id)
		}
	}
	v.list = make([]ModelCard, 0, len(v.cards))
	for _, id := range slices.Sorted(maps.Keys(v.cards)) {
		v.list = append(v.list, v.cards[id])
	}
	m.view.Store(v)
}
