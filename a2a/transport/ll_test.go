package transport

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// TestSlotRoundTrip encodes messages of every size up to a slot's capacity
// and takes them back, whole and into a larger buffer (anyLen), over a slot
// that held a longer message of an older epoch.
func TestSlotRoundTrip(t *testing.T) {
	const capacity = 70
	win := SlotWindow{Name: "test", Bytes: capacity}
	w := make([]uint64, 1+SlotWords(capacity))
	rng := rand.New(rand.NewPCG(1, 2))
	epoch := FirstEpoch
	for n := range capacity + 1 {
		old := make([]byte, capacity)
		for i := range old {
			old[i] = byte(rng.Uint32())
		}
		w[0] = EncodeSlot(w, epoch, 3, old)
		epoch = NextEpoch(NextEpoch(epoch)) // same parity, as a slot sees it
		msg := bytes.Clone(old[:n])
		for i := range msg {
			msg[i] ^= 0xa5
		}
		w[0] = EncodeSlot(w, epoch, 7, msg)
		for _, anyLen := range []bool{false, true} {
			dst := make([]byte, n)
			if anyLen {
				dst = bytes.Repeat([]byte{0xee}, capacity+10)
			}
			var st SlotLoad
			done, err := win.Take(1, w, epoch, 7, dst, anyLen, &st)
			if !done || err != nil || st.Len != n {
				t.Fatalf("%d bytes (anyLen %v): done %v, err %v, state %+v", n, anyLen, done, err, st)
			}
			if !bytes.Equal(dst[:n], msg) || !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xee}, len(dst)-n)) {
				t.Fatalf("%d bytes (anyLen %v): got %x, want %x then untouched bytes", n, anyLen, dst, msg)
			}
		}
	}
}

// TestSlotAnyOrder takes a message whose words become visible one by one in
// a random order, as an RDMA device may place them: every step takes only
// words of the epoch, and the load is done exactly when the last one lands.
func TestSlotAnyOrder(t *testing.T) {
	const n = 37 // 10 data words, the last one partly padding
	msg := make([]byte, n)
	for i := range msg {
		msg[i] = byte(i + 1)
	}
	src := make([]uint64, 1+SlotWords(n))
	src[0] = EncodeSlot(src, FirstEpoch, 1, msg)
	win := SlotWindow{Name: "test", Bytes: 64}
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 50 {
		anyLen := trial%2 == 1
		w := make([]uint64, 1+SlotWords(win.Bytes))
		dst := make([]byte, n)
		if anyLen {
			dst = bytes.Repeat([]byte{0xee}, win.Bytes)
		}
		var st SlotLoad
		for i, j := range rng.Perm(len(src)) {
			w[j] = src[j]
			done, err := win.Take(0, w, FirstEpoch, 1, dst, anyLen, &st)
			if err != nil || done != (i == len(src)-1) {
				t.Fatalf("trial %d, %d words placed: done %v, err %v", trial, i+1, done, err)
			}
		}
		if !bytes.Equal(dst[:n], msg) || !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xee}, len(dst)-n)) {
			t.Fatalf("trial %d: got %x", trial, dst)
		}
	}
}

// TestSlotMismatch: a length word with another tag, a length the buffer
// cannot take or the slot cannot hold fails with ErrMismatch, and a slot
// without a word of the epoch is not begun.
func TestSlotMismatch(t *testing.T) {
	win := SlotWindow{Name: "test", Bytes: 16}
	w := make([]uint64, 1+SlotWords(win.Bytes))
	e := FirstEpoch + 1
	if SlotBegun(w, e) {
		t.Fatal("a zeroed slot is begun")
	}
	w[0] = EncodeSlot(w, e, 2, make([]byte, 12))
	if !SlotBegun(w, e) || SlotBegun(w, e+2) {
		t.Fatal("SlotBegun does not follow the epoch")
	}
	for _, tc := range []struct {
		name   string
		tag    uint32
		dst    int
		anyLen bool
	}{
		{"tag", 3, 12, false},
		{"length", 2, 8, false},
		{"buffer", 2, 8, true},
	} {
		var st SlotLoad
		if _, err := win.Take(0, w, e, tc.tag, make([]byte, tc.dst), tc.anyLen, &st); !errors.Is(err, fault.ErrMismatch) {
			t.Errorf("%s: %v, want ErrMismatch", tc.name, err)
		}
	}
	w[0] = uint64(win.Bytes+4) | 2<<SlotLenBits | uint64(e)<<32
	var st SlotLoad
	if _, err := win.Take(0, w, e, 2, make([]byte, 64), true, &st); !errors.Is(err, fault.ErrMismatch) {
		t.Errorf("length beyond the slot: %v, want ErrMismatch", err)
	}
}

// TestPackedRoundTrip is TestSlotRoundTrip for the packed form, in a slot
// sized for the word form as shm's are: every size up to the capacity comes
// back whole, into an exact and a larger buffer, over an older, longer
// message; a load of the next epoch of the same parity takes nothing; and
// the length checks of the word form hold.
func TestPackedRoundTrip(t *testing.T) {
	const capacity = 70
	win := SlotWindow{Name: "test", Bytes: capacity}
	w := make([]uint64, 1+SlotWords(capacity))
	rng := rand.New(rand.NewPCG(5, 6))
	epoch := FirstEpoch
	for n := range capacity + 1 {
		old := make([]byte, capacity)
		for i := range old {
			old[i] = byte(rng.Uint32())
		}
		w[0] = EncodePacked(w, epoch, 3, old)
		epoch = NextEpoch(NextEpoch(epoch))
		msg := bytes.Clone(old[:n])
		for i := range msg {
			msg[i] ^= 0xa5
		}
		w[0] = EncodePacked(w, epoch, 7, msg)
		if !PackedStored(w, epoch) || PackedStored(w, epoch+2) {
			t.Fatalf("%d bytes: PackedStored does not follow the length word's epoch", n)
		}
		var st SlotLoad
		if done, err := win.TakePacked(1, w, epoch+2, 7, make([]byte, n), false, &st); done || err != nil || st.Known {
			t.Fatalf("%d bytes: a load of a later epoch: done %v, err %v, state %+v", n, done, err, st)
		}
		for _, anyLen := range []bool{false, true} {
			dst := make([]byte, n)
			if anyLen {
				dst = bytes.Repeat([]byte{0xee}, capacity+10)
			}
			var st SlotLoad
			done, err := win.TakePacked(1, w, epoch, 7, dst, anyLen, &st)
			if !done || err != nil || st.Len != n || !st.Known {
				t.Fatalf("%d bytes (anyLen %v): done %v, err %v, state %+v", n, anyLen, done, err, st)
			}
			if !bytes.Equal(dst[:n], msg) || !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xee}, len(dst)-n)) {
				t.Fatalf("%d bytes (anyLen %v): got %x, want %x then untouched bytes", n, anyLen, dst, msg)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		lw     uint64
		tag    uint32
		dst    int
		anyLen bool
	}{
		{"tag", EncodePacked(w, epoch, 2, make([]byte, 12)), 3, 12, false},
		{"length", EncodePacked(w, epoch, 2, make([]byte, 12)), 2, 8, false},
		{"buffer", EncodePacked(w, epoch, 2, make([]byte, 12)), 2, 8, true},
		{"beyond the slot", uint64(capacity+4) | 2<<SlotLenBits | uint64(epoch)<<32, 2, 200, true},
	} {
		w[0] = tc.lw
		var st SlotLoad
		if _, err := win.TakePacked(0, w, epoch, tc.tag, make([]byte, tc.dst), tc.anyLen, &st); !errors.Is(err, fault.ErrMismatch) {
			t.Errorf("%s: %v, want ErrMismatch", tc.name, err)
		}
	}
}

// TestPullLinesBounds: pulling a message's lines reads only words of its
// slot, whatever length the load expects (an anyLen load may expect more
// than the slot holds).
func TestPullLinesBounds(t *testing.T) {
	for _, tc := range []struct{ words, n int }{
		{1, 0}, {1, 8}, {2, 8}, {9, 56}, {9, 64}, {9, 4096},
		{10, 64}, {64, 504}, {64, 505}, {513, 4096}, {513, 1 << 20},
	} {
		w := make([]uint64, tc.words)
		pullLines(w, tc.n) // an index out of w panics
	}
}
