package control

import (
	"bytes"
	"errors"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
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
		if err := checkBounds(p); err != nil && !errors.Is(err, fault.ErrMismatch) {
			t.Fatalf("checkBounds: %v, want ErrMismatch", err)
		}
		var resp joinResp
		if unmarshal(p, &resp) == nil {
			bound("join reply", len(resp.IDs)+len(resp.Nodes)+len(resp.Joined))
		}
		var req joinReq
		if unmarshal(p, &req) == nil {
			bound("join request", len(req.Info.Transports))
		}
		var rep reportMsg
		if unmarshal(p, &rep) == nil {
			bound("report", len(rep.Sent)+len(rep.WaitNS)+len(rep.Last)+len(rep.Ops))
		}
		for _, v := range []any{&pingMsg{}, &claimMsg{}, &hbMsg{}, &abortMsg{}, &leaveMsg{}} {
			_ = unmarshal(p, v)
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

// TestUnmarshalBounds: messages declaring more than they hold, or nesting
// without end, are refused before msgpack sizes anything by them.
func TestUnmarshalBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    []byte
		v    any
	}{
		// {"n": array32 of 2^28-1 nodes}: msgpack allocated ~23 GB for it.
		{"node list", []byte{0x81, 0xa1, 'n', 0xdd, 0x0f, 0xff, 0xff, 0xff}, &joinResp{}},
		{"report sent", []byte{0x9b, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff}, &reportMsg{}},
		{"map", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, &joinReq{}},
		{"string", []byte{0x81, 0xa2, 'i', 'd', 0xdb, 0xff, 0xff, 0xff, 0xff}, &pingMsg{}},
		{"ext", []byte{0xc9, 0x7f, 0xff, 0xff, 0xff, 1}, &pingMsg{}},
		{"nesting", append(bytes.Repeat([]byte{0x91}, 64), 0), &pingMsg{}},
		{"truncated", []byte{0x92, 1}, &hbMsg{}},
		{"reserved byte", []byte{0xc1}, &hbMsg{}},
	} {
		if err := unmarshal(tc.p, tc.v); !errors.Is(err, fault.ErrMismatch) {
			t.Errorf("%s: unmarshal = %v, want ErrMismatch", tc.name, err)
		}
	}
	for _, s := range fuzzSeeds() {
		if err := checkBounds(payloadOf(s.data)); err != nil {
			t.Errorf("%s: an authentic message refused: %v", s.subject, err)
		}
	}
}
