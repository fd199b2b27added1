package control

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzMessages feeds every decoder of a control-message payload (what an
// envelope carries once opened) arbitrary bytes: the msgpack messages of
// rendezvous, membership and reports, and the codec's counts row and column.
// Nothing may panic, and nothing decoded may hold more elements than the
// payload has bytes (each takes at least one), so a few hostile bytes cannot
// make a decoder allocate gigabytes.
func FuzzMessages(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(payloadOf(s.data))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		bound := func(what string, n int) {
			if n > len(p) {
				t.Fatalf("%s: %d elements from %d bytes", what, n, len(p))
			}
		}
		var resp joinResp
		if msgpack.Unmarshal(p, &resp) == nil {
			bound("join reply", len(resp.IDs)+len(resp.Nodes)+len(resp.Joined))
		}
		var req joinReq
		if msgpack.Unmarshal(p, &req) == nil {
			bound("join request", len(req.Info.Transports))
		}
		var rep reportMsg
		if msgpack.Unmarshal(p, &rep) == nil {
			bound("report", len(rep.Sent)+len(rep.WaitNS)+len(rep.Last)+len(rep.Ops))
		}
		for _, v := range []any{&pingMsg{}, &claimMsg{}, &hbMsg{}, &abortMsg{}, &leaveMsg{}} {
			_ = msgpack.Unmarshal(p, v)
		}
		c := getCodec()
		defer putCodec(c)
		if r, err := c.decodeRow(p); err == nil {
			bound("counts row", len(r.counts))
		}
		if r, err := c.decodeCol(p); err == nil {
			bound("counts column", len(r.col)+len(r.mat)+len(r.detail))
		}
		_, _, _ = c.peekSeq(p)
	})
}
