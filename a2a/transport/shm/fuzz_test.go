package shm

import (
	"errors"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// FuzzRecordHeader feeds the shm receiver's record-header check (the frame
// header plus the record kind in the high bits of its flags byte) arbitrary bytes as what
// a peer published in the ring. Nothing may panic; a refusal is ErrMismatch;
// an accepted record is inline, CMA, vectored CMA or mapped and its payload
// lands inside the destination or window.
func FuzzRecordHeader(f *testing.F) {
	want := transport.Header{Kind: transport.OpAllToAllV, Algo: 1, Flags: transport.FlagLast, Epoch: 5, Src: 1, Seq: 9, Len: 32}
	for _, kind := range []byte{recInline, recCMA, recCMAVec, recMap, recMap + 1} {
		var b [hdrSize]byte
		want.Encode(b[:])
		b[kindByte] |= kind << kindShift
		f.Add(b[:], false, uint8(0))
		f.Add(b[:], true, uint8(64))
	}
	f.Fuzz(func(t *testing.T, wire []byte, anyLen bool, window uint8) {
		if len(wire) < hdrSize {
			return // the ring always holds a whole header (recv checks avail first)
		}
		c := &conn{peer: 1}
		var op transport.RecvOp
		op.Reset(want, make([]byte, want.Len), anyLen)
		if window > 0 {
			op.Want.Kind = transport.OpPut
			op.Window = make([]byte, window)
		}
		copy(op.Wire[:], wire)
		if err := c.header(&op); err != nil {
			if !errors.Is(err, fault.ErrMismatch) {
				t.Fatalf("header(%x): %v, want ErrMismatch", wire[:hdrSize], err)
			}
			return
		}
		if k := recKind(&op.Wire); k > recMap {
			t.Fatalf("record kind %d accepted", k)
		}
		if uint64(len(c.rdst)) != op.Got.Len {
			t.Fatalf("%d-byte destination for a %d-byte payload", len(c.rdst), op.Got.Len)
		}
	})
}
