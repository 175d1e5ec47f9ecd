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
			Help: "Records not shared or not applied, by reason: queue_full, disconnected (not published); malformed, unknown_worker, not_placed, too_many (not applied); replay_gap (deltas a starting replica could not replay: gone from the stream)."}, []string{"reason"}),
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
	for _, c := range []prometheus.Collector{m.connected, m.published, m.snapshots, m.received, m.dropped, m.expired, m.lag, m.snapshotLoads, m.snapshotWrites, m.snapshotBytes, remote, peers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
