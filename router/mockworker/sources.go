package mockworker

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
)

// kvEventSource is one data-parallel rank's entry of GET
// /kv_event_sources (vLLM PR 55844): the rank, its endpoints as the
// engine reports them (replay_endpoint null without replay), its topic;
// snapshot_endpoint only with the snapshot service (the field of
// KVEventsConfig in the snapshot PR, vMaroon/vllm@08ee3e54).
type kvEventSource struct {
	DataParallelRank int     `json:"data_parallel_rank"`
	Endpoint         string  `json:"endpoint"`
	ReplayEndpoint   *string `json:"replay_endpoint"`
	SnapshotEndpoint string  `json:"snapshot_endpoint,omitempty"`
	Topic            string  `json:"topic"`
}

// advertise is endpoint with its host replaced by
// Config.KVEventsAdvertiseHost when that is set.
func (s *Server) advertise(endpoint string) string {
	if s.cfg.KVEventsAdvertiseHost == "" {
		return endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint
	}
	return "tcp://" + net.JoinHostPort(s.cfg.KVEventsAdvertiseHost, u.Port())
}

// handleKVEventSources serves GET /kv_event_sources as vLLM does
// (vllm/entrypoints/serve/kv_events/api_router.py, served without dev
// mode): one source per data-parallel rank, by rank, in the
// {"sources": [...]} envelope (vllm-project/vllm@f123199a) or as a bare
// array (@153c3aa2) per Config.KVEventSources; no sources without KV
// events.
func (s *Server) handleKVEventSources(w http.ResponseWriter, _ *http.Request) {
	sources := make([]kvEventSource, 0, len(s.pubs))
	for _, p := range s.pubs {
		src := kvEventSource{DataParallelRank: p.rank, Endpoint: s.advertise(p.endpoint), Topic: s.cfg.KVEventsTopic}
		if p.replay != "" {
			r := s.advertise(p.replay)
			src.ReplayEndpoint = &r
		}
		if p.snapshot != "" {
			src.SnapshotEndpoint = s.advertise(p.snapshot)
		}
		sources = append(sources, src)
	}
	w.Header().Set("Content-Type", "application/json")
	if s.cfg.KVEventSources == SourcesArray {
		_ = json.NewEncoder(w).Encode(sources)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"sources": sources})
}

// handleServerInfo serves SGLang's GET /server_info and /get_server_info:
// a few ServerArgs fields (model_path, served_model_name, page_size,
// dp_size, max_total_num_tokens, context_len) and the kv_events
// descriptor of SGLang PR 25844 (server_args.py
// describe_kv_events_publisher): {"publisher": "zmq", "endpoint_host",
// "endpoint_port_base", "topic", "block_size" (the page size),
// "dp_size"}, or null without KV events. The base is the port rank 0
// bound: with a configured port of 0 the one newKVPublishers chose, rank
// R on base + R (SGLang advertises only a port in 1..65535).
func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	info := map[string]any{
		"model_path": s.model, "served_model_name": s.model, "page_size": s.cfg.Sim.BlockSize,
		"dp_size": len(s.engines), "max_total_num_tokens": s.cfg.Sim.TotalKVBlocks * s.cfg.Sim.BlockSize,
		"context_len": s.maxModelLen(), "version": "switchyard-mock", "kv_events": nil,
	}
	if u, err := url.Parse(s.cfg.KVEventsEndpoint); err == nil && len(s.pubs) > 0 {
		// The port rank 0 bound: the one configured, or the base
		// newKVPublishers chose for port 0.
		if a, ok := s.pubs[0].pub.Addr().(*net.TCPAddr); ok && a.Port > 0 {
			host := u.Hostname()
			if s.cfg.KVEventsAdvertiseHost != "" {
				host = s.cfg.KVEventsAdvertiseHost
			}
			info["kv_events"] = map[string]any{
				"publisher": "zmq", "endpoint_host": host, "endpoint_port_base": a.Port,
				"topic": s.cfg.KVEventsTopic, "block_size": s.cfg.Sim.BlockSize, "dp_size": len(s.engines),
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(info)
}
