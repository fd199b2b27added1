package reduce

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkReduce measures the kernel alone; SetBytes counts the bytes of dst
// processed, so the reported MB/s is the figure the >= 4 GB/s float32 Sum target
// refers to.
func BenchmarkReduce(b *testing.B) {
	cases := []struct {
		dt DType
		op Op
	}{
		{Float32, Sum}, {Float32, Max}, {Float64, Sum}, {BFloat16, Sum}, {Float16, Sum},
		{Int32, Sum}, {Int64, Sum}, {Uint8, Sum},
	}
	for _, c := range cases {
		for _, size := range []int{64 << 10, 1 << 20} {
			name := fmt.Sprintf("%s/%s/%dKiB", c.dt, c.op, size>>10)
			if size >= 1<<20 {
				name = fmt.Sprintf("%s/%s/%dMiB", c.dt, c.op, size>>20)
			}
			b.Run(name, func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				dst, src := randomBuf(rng, c.dt, size), randomBuf(rng, c.dt, size)
				// Alternating src and -src keeps a Sum accumulated over b.N
				// calls bounded: drifting into Inf would measure the
				// out-of-line special-value paths instead.
				srcs := [2][]byte{src, negated(c.dt, src)}
				b.SetBytes(int64(size))
				i := 0
				for b.Loop() {
					if err := Reduce(c.dt, c.op, dst, srcs[i&1]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}

// BenchmarkReduceUnaligned measures the portable path float32 Sum falls back to
// when a buffer is not 4-byte aligned.
func BenchmarkReduceUnaligned(b *testing.B) {
	const size = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	dst, src := randomBuf(rng, Float32, size+1)[1:], randomBuf(rng, Float32, size)
	srcs := [2][]byte{src, negated(Float32, src)}
	b.SetBytes(size)
	i := 0
	for b.Loop() {
		if err := Reduce(Float32, Sum, dst, srcs[i&1]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkReduceTo measures the three-operand form ring algorithms use, with
// fixed inputs and a separate destination.
func BenchmarkReduceTo(b *testing.B) {
	for _, dt := range []DType{Float32, BFloat16} {
		b.Run(dt.String()+"/sum/1MiB", func(b *testing.B) {
			const size = 1 << 20
			rng := rand.New(rand.NewPCG(1, 2))
			x, y, dst := randomBuf(rng, dt, size), randomBuf(rng, dt, size), make([]byte, size)
			b.SetBytes(size)
			for b.Loop() {
				if err := ReduceTo(dt, Sum, dst, x, y); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
