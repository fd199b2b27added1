package transport

import (
	"bytes"
	"errors"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// FuzzHeader feeds the frame-header decoder, and the checks every transport
// runs on a decoded header (Check, Land), arbitrary bytes as a peer's frame
// header. Nothing may panic; every refusal is ErrMismatch; a header that
// decodes re-encodes to the same bytes (the transport's flag bits aside); and a
// header Land accepts puts its payload inside the destination.
func FuzzHeader(f *testing.F) {
	want := Header{Kind: OpAllToAllV, Algo: 2, Flags: FlagLast, Stream: 1, Epoch: 7, Src: 3, Round: 0, Seq: 42, Len: 16}
	for _, h := range []Header{
		want,
		{Kind: OpPut, Src: 3, Epoch: 7, Seq: 42, Len: 8, Aux: 24},           // a put inside a 32-byte window
		{Kind: OpPut, Src: 3, Epoch: 7, Seq: 42, Len: 8, Aux: 1<<64 - 4},    // offset + length wraps
		{Kind: OpSendRecv, Src: 3, Epoch: 7, Seq: 42, Len: 1 << 63, Aux: 9}, // longer than any buffer
	} {
		var b [HeaderSize]byte
		h.Encode(b[:])
		f.Add(b[:], false, uint8(0))
		f.Add(b[:], true, uint8(32))
	}
	f.Fuzz(func(t *testing.T, wire []byte, anyLen bool, window uint8) {
		var got Header
		err := got.Decode(wire)
		if err != nil {
			if !errors.Is(err, fault.ErrMismatch) {
				t.Fatalf("Decode(%x): %v, want ErrMismatch", wire, err)
			}
			return
		}
		var again [HeaderSize]byte
		got.Encode(again[:])
		again[7] |= wire[7] & TransportFlags // shm keeps its record kind there
		if !bytes.Equal(again[:], wire[:HeaderSize]) {
			t.Fatalf("Decode(%x) = %+v re-encodes as %x", wire[:HeaderSize], got, again)
		}

		op := RecvOp{}
		op.Reset(want, make([]byte, want.Len), anyLen)
		if window > 0 {
			op.Window = make([]byte, window)
			op.Want.Kind = OpPut
		}
		op.Got = got
		dst, err := op.Land(int(got.Src))
		switch {
		case err != nil:
			if !errors.Is(err, fault.ErrMismatch) {
				t.Fatalf("Land(%+v): %v, want ErrMismatch", got, err)
			}
		case uint64(len(dst)) != got.Len:
			t.Fatalf("Land(%+v): %d-byte destination for a %d-byte payload", got, len(dst), got.Len)
		case op.Window == nil && len(dst) > 0 && &dst[0] != &op.Dst[0]:
			t.Fatalf("Land(%+v): destination outside Dst", got)
		}
	})
}
