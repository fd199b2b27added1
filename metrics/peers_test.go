package metrics

import (
	"testing"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// TestWatchPeerBytes: the per-peer byte counters read the transport at each
// scrape, a new source replaces the old one, and nil removes the series.
func TestWatchPeerBytes(t *testing.T) {
	o, reg := newObserver(t)
	if s := series(t, reg); s["a2a_peer_sent_bytes_total{peer=1}"] != 0 {
		t.Fatalf("series before any source: %v", s)
	}
	sent := []uint64{0, 10, 30}
	o.WatchPeerBytes(func() transport.Stats {
		return transport.Stats{BytesSent: sent, BytesReceived: []uint64{0, 5, 7}}
	})
	s := series(t, reg)
	for k, want := range map[string]float64{
		"a2a_peer_sent_bytes_total{peer=1}": 10, "a2a_peer_sent_bytes_total{peer=2}": 30,
		"a2a_peer_received_bytes_total{peer=2}": 7, "a2a_peer_sent_bytes_total{peer=0}": 0,
	} {
		if got, ok := s[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	sent[2] = 50 // read at scrape time
	if got := series(t, reg)["a2a_peer_sent_bytes_total{peer=2}"]; got != 50 {
		t.Errorf("after more traffic: %v, want 50", got)
	}
	o.WatchPeerBytes(nil)
	if _, ok := series(t, reg)["a2a_peer_sent_bytes_total{peer=2}"]; ok {
		t.Error("series left after WatchPeerBytes(nil)")
	}
}
