package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the cluster's Prometheus series (docs/replicas.md).
type metrics struct {
	connected prometheus.Gauge
	published prometheus.Counter
	snapshots prometheus.Counter
	received  *prometheus.CounterVec // kind
	dropped   *prometheus.CounterVec // reason
	expired   prometheus.Counter
	lag       prometheus.Histogram

	snapshotLoads  *prometheus.CounterVec // result
	snapshotWrites *prometheus.CounterVec // result
	snapshotBytes  prometheus.Gauge
	snapshotWriter prometheus.Gauge
}

// lagBuckets span 100 us to about 6.5 s.
var lagBuckets = prometheus.ExponentialBuckets(1e-4, 2, 17)

func newMetrics(reg prometheus.Registerer, r *Replica) (*metrics, error) {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "switchyard_cluster_connected",
			Help: "1 while this replica is connected to NATS; 0 while it routes on its own state alone."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_messages_published_total",
			Help: "Deltas messages this replica published."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_snapshots_total",
			Help: "Snapshots of this replica's live bookings sent (on joining, on a peer's hello, after a dropped record)."}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_records_received_total",
			Help: "Records of other replicas applied, by kind (booked, first_token, released, reset)."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_dropped_total",
			Help: "Records not shared or not applied, by reason: queue_full, disconnected (not published); malformed (or from a name that is not a replica name), unknown_worker, not_placed, too_many (bookings or replicas past their bound) (not applied); replay_gap (deltas a starting replica could not replay: gone from the stream)."}, []string{"reason"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_expired_bookings_total",
			Help: "Bookings of other replicas released because their replica fell silent for the booking TTL."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "switchyard_cluster_sync_lag_seconds",
			Help: "From a booking decided on another replica to its booking here (wall clocks of both replicas).", Buckets: lagBuckets}),
		snapshotLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_index_snapshot_loads_total",
			Help: "Prefix-index snapshots loaded at start, by result: loaded, malformed."}, []string{"result"}),
		snapshotWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_index_snapshot_writes_total",
			Help: "Prefix-index snapshots this replica wrote to the object store, by result: written, failed."}, []string{"result"}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "switchyard_cluster_index_snapshot_bytes",
			Help: "Size of the last prefix-index snapshot this replica wrote, in bytes."}),
		snapshotWriter: prometheus.NewGauge(prometheus.GaugeOpts{Name: "switchyard_cluster_index_snapshot_writer",
			Help: "1 while this replica holds the snapshot lease and writes the prefix-index snapshots."}),
	}
	if reg == nil {
		return m, nil
	}
	remote := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "switchyard_cluster_remote_bookings",
		Help: "Bookings of other replicas held in this replica's counts."}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(r.remote)
	})
	peers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "switchyard_cluster_peers",
		Help: "Other replicas heard from within the booking TTL."}, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(len(r.peers))
	})
	for _, c := range []prometheus.Collector{m.connected, m.published, m.snapshots, m.received, m.dropped, m.expired, m.lag, m.snapshotLoads, m.snapshotWrites, m.snapshotBytes, m.snapshotWriter, remote, peers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// kvMetrics are the series of the KV-events relay and its consumers
// (docs/replicas.md), a replica's and a `router kv-relay`'s.
type kvMetrics struct {
	leasesHeld    prometheus.Gauge
	relayed       *prometheus.CounterVec // op
	relayFailures *prometheus.CounterVec // reason
	kvConsumed    *prometheus.CounterVec // op
	kvDropped     *prometheus.CounterVec // reason
	kvStalled     prometheus.Gauge
	kvStalls      prometheus.Counter
	kvRewinds     prometheus.Counter
}

func newKVMetrics(reg prometheus.Registerer) (*kvMetrics, error) {
	m := &kvMetrics{
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "switchyard_cluster_leases_held",
			Help: "Leases this process holds now (one per engine rank it relays)."}),
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_kv_relayed_total",
			Help: "KV events messages this process's relays published to the stream, by op (apply: one engine batch; clear; live)."}, []string{"op"}),
		relayFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_kv_relay_failures_total",
			Help: "KV events a relay could not publish as they were, by reason: publish (the relay starts again), too_large (over NATS's max_payload: a clear sent instead), encode."}, []string{"reason"}),
		kvConsumed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_kv_consumed_total",
			Help: "KV events messages applied from the stream to this replica's precise indexes, by op (apply, clear, live)."}, []string{"op"}),
		kvDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_cluster_kv_dropped_total",
			Help: "KV events messages from the stream not applied, by reason: malformed (the index is cleared); stale_relay (not from the relay the candidate's lease names now: an older relay's, or anyone else's); rewound (the current relay's, read before its lease was seen: read again from its start); malformed_lease (a relay lease's value that does not decode: its relay's messages are not applied)."}, []string{"reason"}),
		kvStalled: prometheus.NewGauge(prometheus.GaugeOpts{Name: "switchyard_cluster_kv_feeds_stalled",
			Help: "Followed engine ranks whose KV events feed is stalled now (no relay lease seen written for twice the lease TTL): their precise indexes are cold."}),
		kvStalls: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_kv_stalls_total",
			Help: "Times a followed engine rank's KV events feed stalled."}),
		kvRewinds: prometheus.NewCounter(prometheus.CounterOpts{Name: "switchyard_cluster_kv_rewinds_total",
			Help: "Times a followed engine rank's KV subject was read again from its relay's start (a new relay seen late, a stall over)."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.leasesHeld, m.relayed, m.relayFailures, m.kvConsumed, m.kvDropped, m.kvStalled, m.kvStalls, m.kvRewinds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
