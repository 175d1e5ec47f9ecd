// Package kvevents speaks vLLM's KV-cache event protocol: the msgpack event
// batches an engine publishes over ZeroMQ when it stores, removes or clears
// KV blocks (SGLang publishes the same format). It has the event types, an
// encoder (used by the mock engine and tests), an allocation-free decoder,
// the three-frame message layout, and a subscriber with sequence tracking,
// replay, snapshot bootstrap (vLLM PR 57789), heartbeats and restart
// detection (docs/kv-events.md).
//
// # Wire format, as verified
//
// Verified against vllm-project/vllm vllm/distributed/kv_events.py at
// commit 0181ea3173e53eea8cf04a86891488e3dc89bb34 (a 2026 main-branch
// version, after PR 42892), and against the array-like declaration of the
// same classes before that PR (vLLM up to v0.2x; the positional layout
// below). Structs are msgspec Structs with omit_defaults=True and tag=True
// (the tag is the class name, under the key "type" in map form).
//
// Message: three ZMQ frames from a PUB socket (vLLM's default endpoint
// tcp://*:5557; data-parallel rank N publishes on port + N):
//
//	topic (bytes, "" by default) | sequence (8 bytes, big-endian, from 0) | payload (msgpack)
//
// A publisher with a snapshot endpoint (vLLM PR 57789, the branch
// vMaroon/vllm@08ee3e54) sends a 24-byte sequence: the 8 bytes, then its
// 16-byte identity (a UUID per publisher lifetime), and an empty batch
// after each idle second (a heartbeat).
//
// Payload, EventBatch: fields ts (float seconds), events (list),
// data_parallel_rank (int or None, default None). Declared array_like
// before PR 42892, so it is [ts, events] or [ts, events, rank]; the
// commit above declares it without array_like, a map
// {"ts":…, "events":…, "data_parallel_rank":…}. Released vLLM v0.26 was
// observed sending the array envelope with map events; both are accepted.
//
// Events, in field order (array form: [type name, fields…], trailing
// fields at their default left out; map form: {"type": name, field: value…},
// fields with a default left out when at it, fields without a default
// always present, possibly nil):
//
//	BlockStored:      block_hashes []hash, parent_block_hash hash|None,
//	                  token_ids []int, block_size int, lora_id int|None,
//	                  medium str|None, lora_name str|None,
//	                  extra_keys [tuple|None]|None = None (one per block),
//	                  group_idx int|None = None,
//	                  kv_cache_spec_kind str|None = None,
//	                  kv_cache_spec_sliding_window int|None = None,
//	                  locality, ownership, session_id, origin str|None = None
//	BlockRemoved:     block_hashes []hash, medium str|None, group_idx int|None = None,
//	                  locality, ownership str|None = None
//	AllBlocksCleared: no fields
//
// Older engines send fewer trailing fields (before medium and lora_name
// existed, BlockStored had 5 fields); missing trailing fields read as None.
// A hash (vLLM's ExternalBlockHash) is bytes or an int: an int is taken as
// its 64-bit two's complement, bytes as their last 8 bytes big-endian
// (fewer than 8 bytes: zero-extended on the left). Event.RawHashes keeps
// how each came (a negative int, or the bytes) when not every hash of the
// event is a non-negative int; the encoder writes them back so.
//
// Replay: an optional ROUTER socket (replay_endpoint, also offset by the
// rank). A client (DEALER) sends [empty delimiter, start sequence as 8 bytes
// big-endian]; the publisher answers every buffered batch with sequence
// >= start as [empty, topic, sequence, payload] frames, then the end marker
// [empty, empty topic, -1 as 8 bytes big-endian, empty payload] (vLLM since
// PR 45177; SGLang and older vLLM send the same without the topic frame;
// both are read). It keeps the last buffer_steps (10,000 by default)
// batches.
//
// Snapshots: an optional ROUTER socket (snapshot_endpoint) answering any
// one-frame request with [cut (8 bytes, signed), publisher identity (16
// bytes), chunk...], each chunk an EventBatch; cut -1: nothing recorded,
// -2: unavailable (exactly two frames).
package kvevents
