package verbs

import ibv "github.com/a2a-moe/a2a/verbs"

// pool is the bounce buffers: registered chunks that frames from Go heap
// memory (and small frames from anywhere) are copied into before the device
// reads them. A buffer is taken per chunk and comes back with the chunk's
// send completion. Used under Transport.mu.
type pool struct {
	mem   []byte
	addr  uint64
	lkey  uint32
	chunk int
	free  []int32
}

func (p *pool) init(r region, chunk int) {
	n := len(r.mem) / chunk
	p.mem, p.addr, p.lkey, p.chunk = r.mem, r.mr.Addr(), r.mr.LKey(), chunk
	p.free = make([]int32, n)
	for i := range n {
		p.free[i] = int32(n - 1 - i)
	}
}

// get takes a buffer: its index and memory, or -1 when all are in flight.
func (p *pool) get() (int, []byte) {
	if len(p.free) == 0 {
		return -1, nil
	}
	i := int(p.free[len(p.free)-1])
	p.free = p.free[:len(p.free)-1]
	return i, p.mem[i*p.chunk : (i+1)*p.chunk]
}

func (p *pool) put(i int) { p.free = append(p.free, int32(i)) }

// sge describes n bytes of buffer i.
func (p *pool) sge(i, n int) ibv.SGE {
	return ibv.SGE{Addr: p.addr + uint64(i*p.chunk), Length: uint32(n), LKey: p.lkey}
}
