package dispatch

// RowsObserver is an Observer that also wants each dispatch's rows by
// destination rank and what its wire format saved: a2ad serve's live view
// draws the ranks' load and the bytes saved from them. *metrics.Observer
// implements it.
type RowsObserver interface {
	// ObserveRows reports a finished dispatch: rankRows[j] is the rows this
	// rank sent rank j (its own included; valid only during the call), and
	// dtypeBytes and wireBytes the bytes the rows sent to other ranks take
	// in Config.DType and in the wire format (Config.Wire's name).
	ObserveRows(rankRows []int, wire string, dtypeBytes, wireBytes int64)
}

// SharedPeerObserver is a SharedTrafficObserver that also wants the
// shared-memory bytes by peer, for the live view's traffic matrix.
// *metrics.Observer implements it.
type SharedPeerObserver interface {
	// ObserveSharedPeer reports one step's bytes with one same-host peer:
	// those this rank gave it and those it got from it.
	ObserveSharedPeer(peer int, sent, received int64)
}

// observeRows tells a RowsObserver of the dispatch that just finished.
func (h *Handle) observeRows() {
	d := h.d
	o, ok := d.cfg.Observer.(RowsObserver)
	if !ok {
		return
	}
	others := 0
	for j, n := range h.plan.RankRows {
		if j != d.rank {
			others += n
		}
	}
	dtype := others * d.rowBytes
	o.ObserveRows(h.plan.RankRows, d.cfg.Wire.String(), int64(dtype), int64(h.wireBytes(dtype)))
}
