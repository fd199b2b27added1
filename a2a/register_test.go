package a2a

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// bufKind says where a rank's send and receive buffers come from.
type bufKind int

const (
	heapBufs       bufKind = iota // make: unregistered, by CMA and rings
	registeredBufs                // AllocBuffer and Register: mapped by peers
	mixedBufs                     // registered on even ranks, heap on odd ones
)

func (k bufKind) String() string { return [...]string{"unregistered", "registered", "mixed"}[k] }

// peerMapped counts the registered buffers that are mapped more than once
// in this process (in-process ranks): by their owner and by a peer.
func peerMapped(t *testing.T, regs []Registration) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range regs {
		if bytes.Count(b, []byte("/memfd:"+transport.SharedName(r.gen)+" ")) > 1 {
			n++
		}
	}
	return n
}

// TestRegisteredCollectives runs every collective that moves bulk data
// between the ranks of a host over registered, unregistered and mixed
// buffers and checks every byte; with registered buffers, peers must have
// mapped them (more mappings than buffers).
func TestRegisteredCollectives(t *testing.T) {
	url := startNATS(t)
	ctx := context.Background()
	const block = 96<<10 + 8 // above the shm CMA threshold, not a page multiple
	for _, n := range []int{2, 3, 4, 8} {
		comms := group(t, url, n, nil)
		for _, kind := range []bufKind{registeredBufs, heapBufs, mixedBufs} {
			t.Run(fmt.Sprintf("ranks%d/%v", n, kind), func(t *testing.T) {
				testRegisteredCollectives(t, ctx, comms, kind, block)
			})
		}
		for _, c := range comms {
			c.Close()
		}
	}
}

func testRegisteredCollectives(t *testing.T, ctx context.Context, comms []*Comm, kind bufKind, block int) {
	n := len(comms)
	// Every rank's buffers: send (n blocks), receive (n blocks).
	send, recv := make([][]byte, n), make([][]byte, n)
	var regs []Registration
	for r := range n {
		for _, b := range []*[]byte{&send[r], &recv[r]} {
			if kind == heapBufs || (kind == mixedBufs && r%2 == 1) {
				*b = make([]byte, n*block)
				continue
			}
			buf, err := AllocBuffer(n * block)
			if err != nil {
				t.Fatal(err)
			}
			reg, err := comms[r].Register(buf)
			if err != nil {
				t.Fatal(err)
			}
			regs = append(regs, reg)
			t.Cleanup(func() {
				if err := comms[r].Deregister(reg); err != nil {
					t.Error(err)
				}
				if err := FreeBuffer(buf); err != nil {
					t.Error(err)
				}
			})
			*b = buf
		}
	}
	fill := func(seed int) {
		for r := range n {
			for i := range send[r] {
				send[r][i] = byte(seed + 7*r + i*13 + i>>9)
			}
			clear(recv[r])
		}
	}
	// blockOf is what rank src's send buffer holds at block k.
	blockOf := func(src, k int) []byte { return send[src][k*block : (k+1)*block] }
	counts := make([]int, n)
	for i := range counts {
		counts[i] = block - 8*i // uneven, still above the threshold
	}
	displs := make([]int, n)
	for i := 1; i < n; i++ {
		displs[i] = displs[i-1] + block
	}
	ops := []struct {
		name  string
		run   func(c *Comm) error
		check func(r int) error
	}{
		{"alltoallv", func(c *Comm) error {
			r := c.Rank()
			rc := make([]int, n)
			for j := range rc {
				rc[j] = counts[r]
			}
			return c.AllToAllV(ctx, send[r], counts, recv[r][:n*counts[r]], rc)
		}, func(r int) error {
			off := 0
			for src := range n {
				want := send[src][sumTo(counts, r) : sumTo(counts, r)+counts[r]]
				if !bytes.Equal(recv[r][off:off+counts[r]], want) {
					return fmt.Errorf("block from rank %d differs", src)
				}
				off += counts[r]
			}
			return nil
		}},
		{"alltoall", func(c *Comm) error { return c.AllToAll(ctx, send[c.Rank()], recv[c.Rank()]) },
			func(r int) error {
				for src := range n {
					if !bytes.Equal(recv[r][src*block:(src+1)*block], blockOf(src, r)) {
						return fmt.Errorf("block from rank %d differs", src)
					}
				}
				return nil
			}},
		{"allgather", func(c *Comm) error { return c.AllGather(ctx, send[c.Rank()][:block], recv[c.Rank()]) },
			func(r int) error {
				for src := range n {
					if !bytes.Equal(recv[r][src*block:(src+1)*block], blockOf(src, 0)) {
						return fmt.Errorf("block of rank %d differs", src)
					}
				}
				return nil
			}},
		{"allgatherv", func(c *Comm) error {
			return c.AllGatherV(ctx, send[c.Rank()][:counts[c.Rank()]], recv[c.Rank()][:sumTo(counts, n)], counts)
		}, func(r int) error {
			for src := range n {
				off := sumTo(counts, src)
				if !bytes.Equal(recv[r][off:off+counts[src]], send[src][:counts[src]]) {
					return fmt.Errorf("block of rank %d differs", src)
				}
			}
			return nil
		}},
		{"broadcast", func(c *Comm) error {
			if c.Rank() != n-1 {
				copy(recv[c.Rank()], make([]byte, len(recv[c.Rank()])))
				return c.Broadcast(ctx, recv[c.Rank()], n-1)
			}
			copy(recv[c.Rank()], send[c.Rank()])
			return c.Broadcast(ctx, recv[c.Rank()], n-1)
		}, func(r int) error {
			if !bytes.Equal(recv[r], send[n-1]) {
				return errors.New("broadcast differs from the root's buffer")
			}
			return nil
		}},
		{"allreduce", func(c *Comm) error { return c.AllReduce(ctx, send[c.Rank()], recv[c.Rank()], Int64, Sum) },
			func(r int) error { return checkSum(recv[r], send, 0) }},
		{"reducescatter", func(c *Comm) error {
			return c.ReduceScatter(ctx, send[c.Rank()], recv[c.Rank()][:block], Int64, Sum)
		}, func(r int) error { return checkSum(recv[r][:block], send, r*block) }},
	}
	for seed, o := range ops {
		fill(seed)
		mustAll(t, onAll(comms, o.run))
		for r := range n {
			if err := o.check(r); err != nil {
				t.Fatalf("%s, rank %d: %v", o.name, r, err)
			}
		}
	}
	if len(regs) > 0 && peerMapped(t, regs) == 0 {
		t.Errorf("peers mapped none of %d registered buffers", len(regs))
	}
}

// sumTo is the sum of counts[:k].
func sumTo(counts []int, k int) int {
	s := 0
	for _, c := range counts[:k] {
		s += c
	}
	return s
}

// checkSum checks that got holds the int64 sum of every rank's send buffer
// from byte off on.
func checkSum(got []byte, send [][]byte, off int) error {
	for i := 0; i+8 <= len(got); i += 8 {
		var want int64
		for _, s := range send {
			want += int64(binary.LittleEndian.Uint64(s[off+i:]))
		}
		if g := int64(binary.LittleEndian.Uint64(got[i:])); g != want {
			return fmt.Errorf("element %d: %d, want %d", i/8, g, want)
		}
	}
	return nil
}

// TestRegister: Register takes AllocBuffer memory only, pins it against
// FreeBuffer until every registration is released, Deregister refuses while
// a send from the buffer is in flight, and a released or zero registration
// cannot be released again.
func TestRegister(t *testing.T) {
	url := startNATS(t)
	c := group(t, url, 1, nil)[0]
	buf, err := AllocBuffer(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(make([]byte, 4096)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Register of heap memory: %v, want ErrInvalidArgument", err)
	}
	// The capacity past len is still the buffer's memory.
	r0, err := c.Register(buf[len(buf)-10 : len(buf)+10])
	if err != nil {
		t.Fatalf("Register into the capacity: %v", err)
	}
	if _, err := c.Register(buf[:0]); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Register of an empty slice: %v, want ErrInvalidArgument", err)
	}
	r1, err := c.Register(buf[100:200])
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	// A send in flight from the buffer (the hold the shm transport takes
	// until the receiver acknowledges): neither Deregister nor FreeBuffer.
	sh, ok := transport.AcquireShared(uintptr(unsafe.Pointer(&buf[0])), 1)
	if !ok {
		t.Fatal("AllocBuffer memory is not shareable")
	}
	if err := c.Deregister(r1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Deregister while a send is in flight: %v, want ErrInvalidArgument", err)
	}
	sh.Release()
	for _, r := range []Registration{r0, r1, r2} {
		if err := FreeBuffer(buf); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("FreeBuffer of a registered buffer: %v, want ErrInvalidArgument", err)
		}
		if err := c.Deregister(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := FreeBuffer(buf); err != nil {
		t.Fatalf("FreeBuffer with no registration left: %v", err)
	}
	if err := c.Deregister(Registration{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Deregister of the zero Registration: %v, want ErrInvalidArgument", err)
	}
	if err := c.Deregister(r1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Deregister after FreeBuffer: %v, want ErrInvalidArgument", err)
	}
}
