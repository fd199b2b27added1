package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// peerBytes exports the bytes the data plane moved with each peer, read from
// the transport's own counters at scrape time (WatchPeerBytes): the
// collectives pay nothing for them, and a rank's series over its peers form
// one row of the group's traffic matrix.
type peerBytes struct {
	stats          atomic.Pointer[func() transport.Stats]
	sent, received *prometheus.Desc
}

func newPeerBytes(ns string) *peerBytes {
	peer := []string{"peer"}
	return &peerBytes{
		sent: prometheus.NewDesc(ns+"_peer_sent_bytes_total",
			"Bytes the data plane sent each peer rank (frame headers included), from the transport's counters.", peer, nil),
		received: prometheus.NewDesc(ns+"_peer_received_bytes_total",
			"Bytes the data plane received from each peer rank (frame headers included), from the transport's counters.", peer, nil),
	}
}

func (p *peerBytes) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.sent
	ch <- p.received
}

func (p *peerBytes) Collect(ch chan<- prometheus.Metric) {
	f := p.stats.Load()
	if f == nil {
		return
	}
	s := (*f)()
	for peer, n := range s.BytesSent {
		ch <- prometheus.MustNewConstMetric(p.sent, prometheus.CounterValue, float64(n), strconv.Itoa(peer))
	}
	for peer, n := range s.BytesReceived {
		ch <- prometheus.MustNewConstMetric(p.received, prometheus.CounterValue, float64(n), strconv.Itoa(peer))
	}
}

// WatchPeerBytes makes the per-peer byte counters (peer_sent_bytes_total
// and peer_received_bytes_total, by peer) read stats at each scrape, for
// example comm.Stats. A later call replaces the source (a new
// communicator's counters restarting from zero read as a counter reset);
// until the first, and after WatchPeerBytes(nil), the families have no
// series.
func (o *Observer) WatchPeerBytes(stats func() transport.Stats) {
	if stats == nil {
		o.peerBytes.stats.Store(nil)
		return
	}
	o.peerBytes.stats.Store(&stats)
}
