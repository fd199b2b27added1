package a2a

import (
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"testing"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// FuzzCheckCounts hands the counts check every AllToAllV-shaped call and
// ExchangeCounts run first arbitrary counts (negative, huge, summing past the
// largest int) and buffer lengths. It must refuse with ErrInvalidArgument
// whatever the buffer cannot hold, before any byte moves.
func FuzzCheckCounts(f *testing.F) {
	le := func(v ...int64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		return b
	}
	f.Add(uint8(3), le(1, 2, 3), int64(6))
	f.Add(uint8(2), le(1, -1), int64(-1))
	f.Add(uint8(2), le(4, 5), int64(8))
	f.Add(uint8(2), le(math.MaxInt64, 1), int64(1<<20))
	f.Fuzz(func(t *testing.T, size uint8, raw []byte, n int64) {
		c := &Comm{size: 1 + int(size)%16}
		counts := make([]int, len(raw)/8)
		for j := range counts {
			counts[j] = int(int64(binary.LittleEndian.Uint64(raw[8*j:])))
		}
		err := c.checkCounts("send", counts, int(n))
		if err != nil {
			if !errors.Is(err, fault.ErrInvalidArgument) {
				t.Fatalf("checkCounts(%v, %d): %v, want ErrInvalidArgument", counts, n, err)
			}
			return
		}
		if len(counts) != c.size {
			t.Fatalf("checkCounts accepts %d counts for %d ranks", len(counts), c.size)
		}
		total := new(big.Int)
		for _, v := range counts {
			if v < 0 {
				t.Fatalf("checkCounts accepts a negative count: %v", counts)
			}
			total.Add(total, big.NewInt(int64(v)))
		}
		if !total.IsInt64() || (n >= 0 && total.Int64() > n) {
			t.Fatalf("checkCounts accepts %v (sum %v) for a %d-byte buffer", counts, total, n)
		}
	})
}
