package transporttest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// AnyLenAndWindow checks window receives (puts land at their offset, an
// empty put at the window's end is allowed) and AnyLen receives (a shorter
// message, an empty one, nothing written past them) on a cluster of two, and
// that a put reaching past the window is ErrMismatch, never a write out of
// bounds. cluster builds n connected transports with the given streams. big
// is a size that must stream through the transport's buffers (0: none),
// adding a put and a longer AnyLen message of that scale. senderRejected
// says the sender of a non-empty put outside the window fails with
// ErrMismatch too (the receiver answers before the payload moves, as shm's
// single-copy path does); otherwise it succeeds.
func AnyLenAndWindow[T transport.Transport](t *testing.T, cluster func(t testing.TB, n, streams int) []T, big int, senderRejected bool) {
	ts := cluster(t, 2, 2)
	win := max(4096, 3*big)
	window := bytes.Repeat([]byte{0xEE}, win)
	dst := bytes.Repeat([]byte{0xEE}, max(1000, 2*big))
	empty := make([]byte, 10)
	put := func(stream, round int, aux uint64, data []byte) Job {
		h := Hdr(0, stream, round, 9)
		h.Kind = transport.OpPut
		h.Aux = aux
		return SendJob(ts[0].Conn(1, stream), h, data)
	}
	recvPut := func(stream, round int) Job {
		want := Hdr(0, stream, round, 9)
		want.Kind = transport.OpPut
		op := new(transport.RecvOp)
		op.Reset(want, nil, true)
		op.Window = window
		return Job{C: ts[1].Conn(0, stream), Recv: op}
	}
	anyRecv := func(round int, buf []byte) Job {
		j := RecvJob(ts[1].Conn(0, 1), Hdr(0, 1, round, 9), buf)
		j.Recv.AnyLen = true
		return j
	}
	puts := []struct {
		aux  uint64
		data []byte
	}{
		{0, Pattern(1, 100)},
		{1000, Pattern(2, 1)},
		{uint64(win - 100), Pattern(3, 100)}, // ends exactly at the window's end
		{uint64(win), nil},                   // empty put at the end: allowed
		{2000, Pattern(4, 48)},
	}
	if big > 0 {
		puts = append(puts, struct {
			aux  uint64
			data []byte
		}{5000, Pattern(5, big+1000)})
	}
	var senders, receivers []Job
	for k, p := range puts {
		senders = append(senders, put(0, k, p.aux, p.data))
		receivers = append(receivers, recvPut(0, k))
	}
	short := Pattern(6, big+300)
	senders = append(senders, SendJob(ts[0].Conn(1, 1), Hdr(0, 1, 0, 9), short),
		SendJob(ts[0].Conn(1, 1), Hdr(0, 1, 1, 9), nil))
	receivers = append(receivers, anyRecv(0, dst), anyRecv(1, empty))
	if err := FirstErr(DriveAll(ts, [][]Job{senders, receivers}, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	wantWin := bytes.Repeat([]byte{0xEE}, win)
	for k, p := range puts {
		copy(wantWin[p.aux:], p.data)
		got := receivers[k].Recv
		if got.N != len(p.data) || got.Got.Aux != p.aux || got.Got.Len != uint64(len(p.data)) {
			t.Errorf("put %d: N %d Got.Aux %d Got.Len %d, want %d bytes at %d", k, got.N, got.Got.Aux, got.Got.Len, len(p.data), p.aux)
		}
	}
	if !bytes.Equal(window, wantWin) {
		t.Error("window contents differ from the puts")
	}
	if op := receivers[len(puts)].Recv; op.N != len(short) || op.Got.Len != uint64(len(short)) ||
		!bytes.Equal(dst[:len(short)], short) || !bytes.Equal(dst[len(short):], bytes.Repeat([]byte{0xEE}, len(dst)-len(short))) {
		t.Errorf("AnyLen receive: N %d, bytes wrong or written past the message", op.N)
	}
	if op := receivers[len(puts)+1].Recv; op.N != 0 || !op.Started {
		t.Errorf("empty AnyLen receive: N %d", op.N)
	}

	for _, tc := range []struct {
		name string
		aux  uint64
		n    int
	}{{"straddles the end", uint64(win - 10), 20}, {"starts past the end", uint64(win + 1), 0}, {"huge offset", 1 << 63, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := cluster(t, 2, 1)
			h := Hdr(0, 0, 0, 9)
			h.Kind = transport.OpPut
			h.Aux = tc.aux
			want := h
			want.Aux = 0
			op := new(transport.RecvOp)
			op.Reset(want, nil, true)
			op.Window = make([]byte, win)
			errs := DriveAll(ts, [][]Job{{SendJob(ts[0].Conn(1, 0), h, make([]byte, tc.n))}, {{C: ts[1].Conn(0, 0), Recv: op}}}, 5*time.Second)
			if !errors.Is(errs[1], fault.ErrMismatch) {
				t.Fatalf("receiver %v, want ErrMismatch", errs[1])
			}
			if tc.n > 0 && senderRejected {
				if !errors.Is(errs[0], fault.ErrMismatch) {
					t.Fatalf("sender %v, want ErrMismatch", errs[0])
				}
			} else if errs[0] != nil {
				t.Fatalf("sender %v", errs[0])
			}
		})
	}
}
