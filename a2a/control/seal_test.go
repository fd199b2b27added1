package control

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestReplayWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		seqs  []uint64
		fresh []bool
	}{
		{"in order", []uint64{1, 2, 3}, []bool{true, true, true}},
		{"duplicate", []uint64{1, 2, 2, 1}, []bool{true, true, false, false}},
		{"reordered within the window", []uint64{5, 3, 4, 3, 5}, []bool{true, true, true, false, false}},
		{"gap then late", []uint64{1, 10, 2, 9, 10}, []bool{true, true, true, true, false}},
		{"too old", []uint64{100, 100 - replayWindow, 100 - replayWindow + 1}, []bool{true, false, true}},
		{"jump beyond the window forgets", []uint64{1, 2, 200, 2, 199}, []bool{true, true, true, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := make(replays)
			for i, seq := range tc.seqs {
				if got := r.fresh(7, "a2a.g.hb", seq); got != tc.fresh[i] {
					t.Fatalf("seq %d (#%d): fresh %v, want %v", seq, i, got, tc.fresh[i])
				}
				// Another subject or sender has a window of its own.
				if !r.fresh(8, "a2a.g.hb", seq+1000*uint64(i)) || !r.fresh(7, "a2a.g.leave", seq+1000*uint64(i)) {
					t.Fatal("windows are not per sender and subject")
				}
			}
		})
	}
}

func TestEnvelope(t *testing.T) {
	mc := newMacSet([]byte("secret")).get("g")
	payload := []byte("\x93\x01\x02\x03")
	msg := sealed(payload)
	env := envelope{sender: 42, epoch: 9, seq: 3}
	mc.seal("a2a.g.hb", "g", env, msg)
	got, p, ok := mc.open("a2a.g.hb", "g", msg)
	if !ok || got != env || !bytes.Equal(p, payload) {
		t.Fatalf("open: %v %v %q", ok, got, p)
	}
	for i := range len(msg) * 8 {
		f := bytes.Clone(msg)
		f[i/8] ^= 1 << (i % 8)
		if _, _, ok := mc.open("a2a.g.hb", "g", f); ok {
			t.Fatalf("bit %d flipped and accepted", i)
		}
	}
	for _, tc := range []struct {
		name, subject, group string
		mc                   *macer
		data                 []byte
	}{
		{"other subject", "a2a.g.abort", "g", mc, msg},
		{"other group", "a2a.g.hb", "h", mc, msg},
		{"other secret", "a2a.g.hb", "g", newMacSet([]byte("other")).get("g"), msg},
		{"no secret", "a2a.g.hb", "g", newMacSet(nil).get("g"), msg},
		{"truncated", "a2a.g.hb", "g", mc, msg[:len(msg)-1]},
		{"empty", "a2a.g.hb", "g", mc, nil},
		{"bare payload", "a2a.g.hb", "g", mc, payload},
	} {
		if _, _, ok := tc.mc.open(tc.subject, tc.group, tc.data); ok {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	// Without a secret each group has its own key.
	ns := newMacSet(nil)
	ns.get("g").seal("s", "g", env, msg)
	if _, _, ok := newMacSet(nil).get("g").open("s", "g", msg); !ok {
		t.Error("no secret: the group key differs between parties")
	}
	if _, _, ok := ns.get("h").open("s", "g", msg); ok {
		t.Error("no secret: group h's key opens group g's message")
	}
}

// TestSealAllocations: signing and opening a counts row allocate nothing.
func TestSealAllocations(t *testing.T) {
	mc := newMacSet([]byte("secret")).get("g")
	c := getCodec()
	counts := make([]int, 64)
	r := make(replays)
	seq := uint64(0)
	if a := testing.AllocsPerRun(200, func() {
		seq++
		msg := c.encodeRow(5, seq, 1, 0, counts)
		mc.seal("a2a.svc.g.counts", "g", envelope{sender: 1, epoch: 5, seq: seq}, msg)
		env, p, ok := mc.open("a2a.svc.g.counts", "g", msg)
		if !ok || !r.fresh(env.sender, "a2a.svc.g.counts", env.seq) {
			t.Fatal("rejected")
		}
		if _, err := c.decodeRow(p); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%.1f allocations per row", a)
	}
}

// fuzzSecret, fuzzGroup and fuzzSubject sign the seed corpus of FuzzEnvelope
// (testdata/fuzz/FuzzEnvelope: one authentic message of every kind).
const (
	fuzzSecret = "fuzz-secret"
	fuzzGroup  = "g"
)

// FuzzEnvelope feeds the signed-envelope decoder arbitrary bytes and
// subjects. Nothing may panic, and nothing but an authentic message (one of
// the seeds, signed with the key) may open: an accepted input re-seals to
// itself. What opens is then decoded by every message decoder, which must not
// panic either.
func FuzzEnvelope(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s.data, s.subject)
	}
	mc := newMacSet([]byte(fuzzSecret)).get(fuzzGroup)
	f.Fuzz(func(t *testing.T, data []byte, subject string) {
		env, p, ok := mc.open(subject, fuzzGroup, data)
		if !ok {
			return
		}
		again := sealed(p)
		mc.seal(subject, fuzzGroup, env, again)
		if !bytes.Equal(again, data) {
			t.Fatalf("accepted a message that is not the one signed: %x", data)
		}
		c := getCodec()
		defer putCodec(c)
		_, _ = c.decodeRow(p)
		_, _ = c.decodeCol(p)
		_, _, _ = c.peekSeq(p)
		for _, v := range []any{&pingMsg{}, &claimMsg{}, &joinReq{}, &joinResp{}, &hbMsg{}, &abortMsg{}, &leaveMsg{}} {
			_ = unmarshal(p, v)
		}
	})
}

type fuzzSeed struct {
	subject string
	data    []byte
}

// fuzzSeeds are authentic messages of every kind, as the corpus holds them.
func fuzzSeeds() []fuzzSeed {
	mc := newMacSet([]byte(fuzzSecret)).get(fuzzGroup)
	c := getCodec()
	defer putCodec(c)
	var out []fuzzSeed
	seq := uint64(0)
	add := func(subject string, epoch uint32, msg []byte) {
		seq++
		mc.seal(subject, fuzzGroup, envelope{sender: 77, epoch: epoch, seq: seq}, msg)
		out = append(out, fuzzSeed{subject, bytes.Clone(msg)})
	}
	pack := func(v any) []byte { b, _ := msgpack.Marshal(v); return sealed(b) }
	add(svcSubject(fuzzGroup, opPing), 0, pack(&pingMsg{ID: "1z"}))
	add(svcSubject(fuzzGroup, opClaim), 0, pack(&claimMsg{ID: "1z", Nonce: 5}))
	add(svcSubject(fuzzGroup, opJoin), 0, pack(&joinReq{ID: "25", Rank: 1, World: 2, Streams: 2, TimeoutMS: 1500,
		Info: NodeInfo{Rank: 1, Host: "h", PID: 3, Transports: map[string][]byte{"tcp": []byte("127.0.0.1:1")}, Streams: 2}}))
	add("_INBOX.g.x.r", 9, pack(&joinResp{Status: stFormed, Service: "svc-1", Epoch: 9, World: 2, IDs: []string{"25", "26"},
		Nodes: []NodeInfo{{Rank: 0}, {Rank: 1}}}))
	add(groupSubject(fuzzGroup, opHB), 9, pack(&hbMsg{Epoch: 9, Rank: 1}))
	add(groupSubject(fuzzGroup, opAbort), 9, pack(&abortMsg{Epoch: 9, Origin: 1, Kind: 3, Rank: 0, Detail: "lost"}))
	add(groupSubject(fuzzGroup, opLeave), 9, pack(&leaveMsg{Epoch: 9, Rank: 1}))
	add(svcSubject(fuzzGroup, opCounts), 9, bytes.Clone(c.encodeRow(9, 4, 1, rowWantMatrix, []int{3, 70446})))
	add("_INBOX.g.x.c", 9, bytes.Clone(c.encodeCol(4, 9, make([]byte, 16), make([]byte, 32))))
	add("_INBOX.g.x.c", 9, bytes.Clone(c.encodeColErr(4, 9, nil, -1, "refused")))
	return out
}
