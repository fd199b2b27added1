package algo

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"testing"
)

// FuzzAllToAllVMatrix plans an AllToAllV of an arbitrary small traffic
// matrix with every algorithm on every rank, runs the schedules in the
// simulator and checks every received byte: whatever the counts (empty
// blocks, uneven rows, frames of a few bytes), every algorithm that accepts
// them delivers each block whole to its place, without deadlock.
func FuzzAllToAllVMatrix(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, uint8(1), uint8(1), uint8(0), uint8(0), uint8(0))
	f.Add([]byte{200, 0, 0, 7, 0, 0, 90, 91, 0, 1, 2, 3, 4, 5, 6, 7}, uint8(3), uint8(1), uint8(1), uint8(7), uint8(3))
	f.Add([]byte{255, 255, 1, 0, 0, 0, 0, 0, 9, 9, 9, 9, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, uint8(5), uint8(2), uint8(2), uint8(15), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, world, per, streams, block, which uint8) {
		p := 1 + int(world)%6
		l := 1 + int(per)%p
		for p%l != 0 {
			l--
		}
		hosts := make([]int, p)
		for r := range hosts {
			hosts[r] = r / l
		}
		m := make([]int, p*p)
		for k := range m {
			if k < len(data) {
				m[k] = int(data[k])
			}
		}
		s, b := 1+int(streams)%3, 1+int(block)%64
		algo := []Algo{AlgoPairwise, AlgoFullmesh, AlgoLL, AlgoStaged, AlgoSkew}[int(which)%5]
		scheds := make([]*Schedule, p)
		send, recv := make([][]byte, p), make([][]byte, p)
		for r := range p {
			a := AllToAllVArgs{Rank: r, World: p, SendCounts: make([]int, p), RecvCounts: make([]int, p), Streams: s, BlockSize: b}
			for j := range p {
				a.SendCounts[j], a.RecvCounts[j] = m[r*p+j], m[j*p+r]
				send[r] = append(send[r], make([]byte, m[r*p+j])...)
			}
			off := 0
			for j := range p {
				for k := range m[r*p+j] {
					send[r][off+k] = byte(r*31 + j*7 + k)
				}
				off += m[r*p+j]
			}
			scheds[r] = new(Schedule)
			var err error
			switch algo {
			case AlgoPairwise:
				err = PlanPairwise(scheds[r], a)
			case AlgoFullmesh:
				err = PlanFullmesh(scheds[r], a)
			case AlgoLL:
				a.LLCutoff = make([]int, p)
				for j := range p {
					a.LLCutoff[j] = -1
					if hosts[j] == hosts[r] {
						a.LLCutoff[j] = b // both ends of a pair hold the same cutoff
					}
				}
				err = PlanLL(scheds[r], a)
			case AlgoStaged:
				err = PlanStaged(scheds[r], StagedArgs{Rank: r, World: p, Matrix: m, Hosts: hosts, Streams: s, BlockSize: b})
			case AlgoSkew:
				err = PlanSkew(scheds[r], SkewArgs{Rank: r, World: p, Matrix: m, Streams: s, Window: int(block) % 3, BlockSize: b})
			}
			if err != nil {
				t.Fatalf("%v, p=%d, %d per host, matrix %v: rank %d: %v", algo, p, l, m, r, err)
			}
			total := 0
			for i := range p {
				total += m[i*p+r]
			}
			recv[r] = make([]byte, total)
		}
		if err := Simulate(scheds, send, recv); err != nil {
			t.Fatalf("%v, p=%d, %d per host, matrix %v: %v", algo, p, l, m, err)
		}
		for r := range p {
			off := 0
			for i := range p {
				for k := range m[i*p+r] {
					if got, want := recv[r][off+k], byte(i*31+r*7+k); got != want {
						t.Fatalf("%v, p=%d, matrix %v: rank %d byte %d of rank %d's block is %#x, want %#x", algo, p, m, r, k, i, got, want)
					}
				}
				off += m[i*p+r]
			}
		}
	})
}

// FuzzAllToAllVArgs hands the planners arbitrary counts (negative, huge,
// summing past the largest int) and block sizes. Validate must refuse what
// no buffer can hold; what it accepts must plan into spans that stay inside
// buffers of the counts' sums.
func FuzzAllToAllVArgs(f *testing.F) {
	le := func(v ...int64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		return b
	}
	f.Add(uint8(0), le(3, 4, 5, 3, 4, 5), int64(0))
	f.Add(uint8(1), le(1, -1, 1, 1), int64(2))
	f.Add(uint8(0), le(math.MaxInt64, 2, math.MaxInt64, 2), int64(1<<20))
	f.Add(uint8(1), le(0, math.MaxInt64-1, 0, 5), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, rank uint8, raw []byte, block int64) {
		n := len(raw) / 16 // a send and a receive count per rank
		if n == 0 || n > 16 {
			return
		}
		a := AllToAllVArgs{Rank: int(rank) % n, World: n, SendCounts: make([]int, n), RecvCounts: make([]int, n), Streams: 2, BlockSize: int(block)}
		for j := range n {
			a.SendCounts[j] = int(int64(binary.LittleEndian.Uint64(raw[16*j:])))
			a.RecvCounts[j] = int(int64(binary.LittleEndian.Uint64(raw[16*j+8:])))
		}
		if err := a.Validate(); err != nil {
			return
		}
		sendTotal, ok1 := sum(a.SendCounts)
		recvTotal, ok2 := sum(a.RecvCounts)
		if !ok1 || !ok2 {
			t.Fatalf("Validate accepts counts summing past the largest int: %v / %v", a.SendCounts, a.RecvCounts)
		}
		blockSize := a.BlockSize
		if blockSize <= 0 {
			blockSize = DefaultBlockSize
		}
		frames := 0
		for _, c := range append(a.SendCounts, a.RecvCounts...) {
			want := 1
			if c > 0 {
				want = 1 + (c-1)/blockSize // ceil, without overflow
			}
			if got := FrameCount(c, a.BlockSize); got != want {
				t.Fatalf("FrameCount(%d, %d) = %d, want %d", c, a.BlockSize, got, want)
			}
			frames += min(want, 1<<20)
		}
		if frames > 1<<14 {
			return // a plan too large to look at; the counts themselves are fine
		}
		for _, plan := range []struct {
			name string
			f    func(*Schedule, AllToAllVArgs) error
		}{{"pairwise", PlanPairwise}, {"fullmesh", PlanFullmesh}} {
			var s Schedule
			if err := plan.f(&s, a); err != nil {
				t.Fatalf("%s: Validate passed, plan failed: %v", plan.name, err)
			}
			for _, st := range s.Steps {
				for _, sp := range []Span{st.Src, st.Dst} {
					size := map[Buf]int{BufSend: sendTotal, BufRecv: recvTotal, BufScratch: s.ScratchBytes}[sp.Buf]
					if sp.Off < 0 || sp.Len < 0 || sp.Len > size || sp.Off > size-sp.Len {
						t.Fatalf("%s: step %v: span %+v outside a %d-byte %v buffer", plan.name, st, sp, size, sp.Buf)
					}
				}
			}
		}
	})
}

// sum adds v, reporting false when the sum overflows.
func sum(v []int) (int, bool) {
	total := 0
	for _, x := range v {
		s, carry := bits.Add64(uint64(total), uint64(x), 0)
		if carry != 0 || int(s) < 0 || x < 0 {
			return 0, false
		}
		total = int(s)
	}
	return total, true
}

// FuzzParseLinks feeds the link-table decoder (an `a2ad tune` file, which
// A2A_LINKS names) arbitrary bytes. It refuses with ErrBadLinks, or returns
// a table the cost model prices without NaN and every rank would pick from
// alike: the same pick twice.
func FuzzParseLinks(f *testing.F) {
	f.Add([]byte(`{"local":{"Alpha":1e-06,"Beta":1.25e-10,"Lanes":1},"remote":{"Alpha":1e-05,"Beta":3.3e-10,"Lanes":1},"local_class":"shm","remote_class":"tcp"}`))
	f.Add([]byte(`{"local":{"Alpha":0,"Beta":1e-300,"Lanes":0},"remote":{"Alpha":1e308,"Beta":1e308,"Lanes":9223372036854775807}}`))
	f.Add([]byte(`{"local":{"Alpha":-1,"Beta":1,"Lanes":1}}`))
	f.Add([]byte(`{"local":{"Alpha":1,"Beta":1e999}}`))
	f.Add([]byte(`[]`))
	m := []int{0, 9, 1, 1, 9000, 0, 1, 1, 1, 1, 0, 7, 1, 1, 1, 0}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLinks(b)
		if err != nil {
			if !errors.Is(err, ErrBadLinks) {
				t.Fatalf("ParseLinks(%q): %v, want ErrBadLinks", b, err)
			}
			return
		}
		var c Chooser
		args := ChoiceArgs{World: 4, Streams: 2, Matrix: m, Hosts: []int{0, 0, 1, 1}, Links: l}
		cands, pick := c.Price(args)
		for _, cand := range cands {
			if math.IsNaN(cand.Estimate) {
				t.Fatalf("links %+v: %v estimated NaN", l, cand.Algo)
			}
		}
		if again := c.Choose(args); again != pick {
			t.Fatalf("links %+v: picked %v, then %v", l, pick, again)
		}
	})
}
