package live

import (
	"net/http"
	"time"

	"github.com/switchyard-router/switchyard/router/workers"
)

// DebugWorkers is the /debug/workers answer (on --debug-listen's address):
// the router's whole view of each configured worker, sorted by name.
type DebugWorkers struct {
	Workers []WorkerView `json:"workers"`
}

// WorkerView is one configured worker in /debug/workers.
type WorkerView struct {
	Name       string `json:"name"`
	URL        string `json:"url"`
	MetricsURL string `json:"metrics_url"`
	Role       string `json:"role"`
	// Ready is true while every rank of the worker is a candidate; Reason
	// is workers.Status.Reason (absent when nothing is amiss).
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Models are the models the worker is routed for; ModelsSource is
	// "config" (its block), "engine" (GET /v1/models) or "unknown".
	Models       []string `json:"models"`
	ModelsSource string   `json:"models_source"`
	// DataParallel is true when the engine reports data-parallel ranks:
	// requests name their rank in X-Data-Parallel-Rank.
	DataParallel bool `json:"data_parallel"`
	// KVEvents is the worker's kv_events block; absent without one.
	KVEvents *KVEventsView `json:"kv_events,omitempty"`
	// ScrapeFailures and RequestFailures are the consecutive failures.
	ScrapeFailures  int `json:"scrape_failures"`
	RequestFailures int `json:"request_failures"`
	// Ranks are the worker's candidates, one per data-parallel rank.
	Ranks []RankView `json:"ranks"`
}

// KVEventsView is a worker's kv_events block in /debug/workers.
type KVEventsView struct {
	Endpoint       string `json:"endpoint"`
	Topic          string `json:"topic"`
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
}

// RankView is one candidate (worker, data-parallel rank) in
// /debug/workers.
type RankView struct {
	Rank uint32 `json:"rank"`
	// Generation is the candidate's fleet generation; absent when it is
	// not a member. ActiveRequests is its requests in flight.
	Generation     uint64 `json:"generation,omitempty"`
	ActiveRequests int64  `json:"active_requests"`
	// Labels are the labels a plugin that declares LABELS sees for the
	// candidate (shared.Candidates.Labels): the worker block's or pod's
	// labels with the router-set switchyard.io/ keys; absent when it is
	// not a member.
	Labels map[string]string `json:"labels,omitempty"`
	// CapacityBlocks is the KV capacity in router blocks (0: unknown);
	// CapacitySource is "config", "engine" or "unknown".
	CapacityBlocks int64  `json:"capacity_blocks"`
	CapacitySource string `json:"capacity_source"`
	// EngineBlockSize is the engine's KV block size in tokens; absent
	// while unknown.
	EngineBlockSize int64 `json:"engine_block_size,omitempty"`
	// Load is the engine's report of the rank.
	Load LoadView `json:"load"`
	// PrefixIndexBlocks is the prefix-index entries held for the
	// candidate; absent while unknown.
	PrefixIndexBlocks *int64 `json:"prefix_index_blocks,omitempty"`
	// Events is the candidate's KV-event stream; absent without one.
	Events *workers.EventStream `json:"kv_events,omitempty"`
}

// LoadView is a rank's engine load in /debug/workers. A field the engine
// does not report is absent.
type LoadView struct {
	// Available is true while the engine's last report is fresh.
	Available bool     `json:"available"`
	KVUsage   *float64 `json:"kv_usage,omitempty"`
	Waiting   *int64   `json:"waiting,omitempty"`
	Running   *int64   `json:"running,omitempty"`
	// LastReport is when the last report with a load arrived, and
	// AgeSeconds how long ago; absent when none ever did.
	LastReport *time.Time `json:"last_report,omitempty"`
	AgeSeconds *float64   `json:"age_seconds,omitempty"`
}

// debugWorkers answers GET /debug/workers with DebugWorkers; its size is
// linear in the workers and ranks configured.
func (rt *Runtime) debugWorkers(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, debugView(rt.workers.Status(), time.Now()))
}

// debugView builds the /debug/workers answer from sts at now.
func debugView(sts []workers.Status, now time.Time) DebugWorkers {
	out := DebugWorkers{Workers: make([]WorkerView, 0, len(sts))}
	for _, st := range sts {
		v := WorkerView{
			Name: st.Config.Name, URL: st.Config.URL, MetricsURL: st.Config.MetricsURL, Role: string(st.Config.Role),
			Ready: st.Ready, Reason: st.Reason, Models: st.Models, ModelsSource: orUnknown(st.ModelsSource),
			DataParallel: st.Ranked, ScrapeFailures: st.ScrapeFailures, RequestFailures: st.RequestFailures,
			Ranks: make([]RankView, 0, len(st.Ranks)),
		}
		if v.Models == nil {
			v.Models = []string{}
		}
		if k := st.Config.KVEvents; k != nil {
			v.KVEvents = &KVEventsView{Endpoint: k.Endpoint, Topic: k.Topic, ReplayEndpoint: k.ReplayEndpoint}
		}
		for _, r := range st.Ranks {
			rv := RankView{
				Rank: r.Rank, CapacityBlocks: r.TotalKVBlocks, CapacitySource: orUnknown(r.CapacitySource),
				EngineBlockSize: r.EngineBlockSize, Events: r.Events,
			}
			if r.Member != nil {
				rv.Generation, rv.ActiveRequests = r.Member.Generation, r.Member.ActiveRequests()
				rv.Labels = r.Member.AllLabels.Map()
			}
			if r.HasIndexBlocks {
				n := r.IndexBlocks
				rv.PrefixIndexBlocks = &n
			}
			if l := r.Load; l != nil {
				rv.Load.Available = true
				if l.HasKVUsage {
					rv.Load.KVUsage = &l.KVUsage
				}
				if l.HasWaiting {
					rv.Load.Waiting = &l.Waiting
				}
			}
			if r.HasRunning {
				n := r.Running
				rv.Load.Running = &n
			}
			if !r.LastReport.IsZero() {
				at, age := r.LastReport, now.Sub(r.LastReport).Seconds()
				rv.Load.LastReport, rv.Load.AgeSeconds = &at, &age
			}
			v.Ranks = append(v.Ranks, rv)
		}
		out.Workers = append(out.Workers, v)
	}
	return out
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
