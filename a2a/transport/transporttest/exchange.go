package transporttest

import (
	"bytes"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// Exchange sends a frame of every size in sizes from every rank to every
// peer on every stream, all at once, and checks every byte and the byte
// counters (payload plus a header per frame). Each frame is a window of its
// sender's pattern at an offset unique to (receiver, stream, round), so a
// frame delivered to the wrong place shows in its bytes.
func Exchange[T transport.Transport](t testing.TB, ts []T, sizes []int) {
	t.Helper()
	n, S := len(ts), ts[0].Streams()
	maxSize, total := 0, 0
	for _, s := range sizes {
		maxSize = max(maxSize, s)
		total += s
	}
	const spread = 1 << 16 // room for distinct offsets into a rank's pattern
	pats := make([][]byte, n)
	for r := range n {
		pats[r] = Pattern(uint64(r)+1, maxSize+spread)
	}
	frame := func(src, dst, s, k int) []byte {
		off := ((dst*S+s)*len(sizes) + k) * 97 % spread
		return pats[src][off : off+sizes[k]]
	}
	jobs := make([][]Job, n)
	recvBufs := make(map[[3]int][]byte) // (dst, src, s) -> all of the frames
	for r := range n {
		for p := range n {
			if p == r {
				continue
			}
			for s := range S {
				c := ts[r].Conn(p, s)
				buf := make([]byte, total)
				recvBufs[[3]int{r, p, s}] = buf
				off := 0
				for k, size := range sizes {
					jobs[r] = append(jobs[r], SendJob(c, Hdr(r, s, k, 11), frame(r, p, s, k)))
					jobs[r] = append(jobs[r], RecvJob(c, Hdr(p, s, k, 11), buf[off:off+size]))
					off += size
				}
			}
		}
	}
	if err := FirstErr(DriveAll(ts, jobs, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	for key, buf := range recvBufs {
		dst, src, s := key[0], key[1], key[2]
		off := 0
		for k, size := range sizes {
			if !bytes.Equal(buf[off:off+size], frame(src, dst, s, k)) {
				t.Fatalf("rank %d: frame %d (%d bytes) from rank %d stream %d corrupted", dst, k, size, src, s)
			}
			off += size
		}
	}
	wire := uint64(S * (total + len(sizes)*transport.HeaderSize))
	for r, tr := range ts {
		st := tr.Stats()
		for p := range n {
			want := wire
			if p == r {
				want = 0
			}
			if st.BytesSent[p] != want || st.BytesReceived[p] != want {
				t.Errorf("rank %d stats for peer %d: sent %d received %d, want %d", r, p, st.BytesSent[p], st.BytesReceived[p], want)
			}
		}
	}
}
