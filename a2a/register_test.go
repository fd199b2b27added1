package a2a

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"
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
// between the ranks of a host, and SendRecv, over registered, unregistered
// and mixed buffers and checks every byte; with registered buffers, peers must have
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
	root := n / 2 // the rooted collectives: not rank 0
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
		{"reduce", func(c *Comm) error { return c.Reduce(ctx, send[c.Rank()], recv[c.Rank()], Int64, Sum, root) },
			func(r int) error {
				if r != root {
					return nil
				}
				return checkSum(recv[r], send, 0)
			}},
		{"gather", func(c *Comm) error {
			var dst []byte
			if c.Rank() == root {
				dst = recv[root]
			}
			return c.Gather(ctx, send[c.Rank()][:block], dst, root)
		}, func(r int) error {
			if r != root {
				return nil
			}
			for src := range n {
				if !bytes.Equal(recv[r][src*block:(src+1)*block], blockOf(src, 0)) {
					return fmt.Errorf("block of rank %d differs", src)
				}
			}
			return nil
		}},
		{"gatherv", func(c *Comm) error {
			return c.GatherV(ctx, send[c.Rank()][:counts[c.Rank()]], recv[c.Rank()][:sumTo(counts, n)], counts, root)
		}, func(r int) error {
			if r != root {
				return nil
			}
			for src := range n {
				off := sumTo(counts, src)
				if !bytes.Equal(recv[r][off:off+counts[src]], send[src][:counts[src]]) {
					return fmt.Errorf("block of rank %d differs", src)
				}
			}
			return nil
		}},
		{"scatter", func(c *Comm) error { return c.Scatter(ctx, send[c.Rank()], recv[c.Rank()][:block], root) },
			func(r int) error {
				if !bytes.Equal(recv[r][:block], blockOf(root, r)) {
					return errors.New("block from the root differs")
				}
				return nil
			}},
		{"scatterv", func(c *Comm) error {
			return c.ScatterV(ctx, send[c.Rank()][:sumTo(counts, n)], counts, recv[c.Rank()][:counts[c.Rank()]], root)
		}, func(r int) error {
			off := sumTo(counts, r)
			if !bytes.Equal(recv[r][:counts[r]], send[root][off:off+counts[r]]) {
				return errors.New("block from the root differs")
			}
			return nil
		}},
		{"sendrecv", func(c *Comm) error {
			r := c.Rank()
			got, err := c.SendRecv(ctx, send[r], (r+1)%n, 7, recv[r], (r+n-1)%n, 7)
			if err == nil && got != len(send[r]) {
				err = fmt.Errorf("received %d bytes, want %d", got, len(send[r]))
			}
			return err
		}, func(r int) error {
			if !bytes.Equal(recv[r], send[(r+n-1)%n]) {
				return errors.New("message from the previous rank differs")
			}
			return nil
		}},
	}
	var inPlace uint64 // frames the reductions read from peers' buffers in place
	for seed, o := range ops {
		fill(seed)
		before := inPlaceReductions(comms)
		mustAll(t, onAll(comms, o.run))
		for r := range n {
			if err := o.check(r); err != nil {
				t.Fatalf("%s, rank %d: %v", o.name, r, err)
			}
		}
		if d := inPlaceReductions(comms) - before; o.name == "allreduce" || o.name == "reducescatter" {
			inPlace += d
		}
	}
	// Above 2 ranks the ReduceScatter ring sends partial sums from the
	// engine's scratch from its second round on (n-2 frames a rank: one
	// block is one frame here), and the scratch is shareable: those are
	// reduced in place whatever the user's buffers. Registered buffers
	// add the first round's frames (n-1 a rank in all).
	fromScratch := uint64(n * (n - 2))
	t.Logf("%d frames reduced in place", inPlace)
	switch {
	case kind == registeredBufs && inPlace < uint64(n*(n-1)):
		t.Errorf("AllReduce and ReduceScatter over registered buffers reduced %d frames in place, want at least %d (every ring round)", inPlace, n*(n-1))
	case kind == heapBufs && inPlace != fromScratch:
		t.Errorf("%d frames of heap buffers reduced in place, want %d (the ring's partial sums from scratch)", inPlace, fromScratch)
	}
	if len(regs) > 0 && peerMapped(t, regs) == 0 {
		t.Errorf("peers mapped none of %d registered buffers", len(regs))
	}
}

// inPlaceReductions is how many frames comms reduced straight from a
// peer's registered buffer.
func inPlaceReductions(comms []*Comm) uint64 {
	var n uint64
	for _, c := range comms {
		n += c.eng.InPlaceReductions()
	}
	return n
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

// TestDeregisterUnderUse: while an AllToAll sends from a registered buffer
// (rank 0 has entered, rank 1 not yet, so rank 0's descriptor waits for a
// receiver that will read the buffer), Deregister and FreeBuffer fail with
// ErrInvalidArgument and keep the registration; once the call is done on
// both ranks, with every byte right, both succeed.
func TestDeregisterUnderUse(t *testing.T) {
	url := startNATS(t)
	ctx := context.Background()
	comms := group(t, url, 2, nil)
	const block = 1 << 20
	send, err := AllocBuffer(2 * block)
	if err != nil {
		t.Fatal(err)
	}
	for i := range send {
		send[i] = byte(i*7 + i>>12)
	}
	reg, err := comms[0].Register(send)
	if err != nil {
		t.Fatal(err)
	}
	recv0, send1, recv1 := make([]byte, 2*block), make([]byte, 2*block), make([]byte, 2*block)
	done := make(chan error, 1)
	go func() { done <- comms[0].AllToAll(ctx, send, recv0) }()
	// Until rank 0's send holds the buffer, a Deregister of a second
	// registration succeeds; then it fails, and the registration stays.
	var inUse error
	deadline := time.Now().Add(10 * time.Second)
	for inUse == nil && time.Now().Before(deadline) {
		probe, err := comms[0].Register(send)
		if err != nil {
			t.Fatal(err)
		}
		if inUse = comms[0].Deregister(probe); inUse == nil {
			time.Sleep(time.Millisecond)
		}
	}
	if !errors.Is(inUse, ErrInvalidArgument) {
		t.Fatalf("Deregister while rank 0 sends from the buffer: %v, want ErrInvalidArgument", inUse)
	}
	if err := comms[0].Deregister(reg); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Deregister of the first registration under use: %v, want ErrInvalidArgument", err)
	}
	if err := FreeBuffer(send); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("FreeBuffer under use: %v, want ErrInvalidArgument", err)
	}
	if err := comms[1].AllToAll(ctx, send1, recv1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(recv1[:block], send[block:]) {
		t.Error("rank 1 received wrong bytes from the registered buffer")
	}
	// Both registrations (the first and the probe that failed to go).
	for range 2 {
		if err := comms[0].Deregister(reg); err != nil {
			t.Fatalf("Deregister after the call: %v", err)
		}
	}
	if err := FreeBuffer(send); err != nil {
		t.Fatalf("FreeBuffer after the call: %v", err)
	}
}

// soakBuf is one AllocBuffer buffer of a soak rank and its registrations.
type soakBuf struct {
	mem  []byte
	regs []Registration
	gen  uint64
}

// TestRegisteredSoak: 3 ranks run random collectives over buffers that are
// allocated, registered, deregistered and freed at random between the
// calls, each rank choosing for itself between a registered buffer and the
// heap; every byte is checked. Freeing a registered buffer must fail. At the
// end nothing of any buffer stays mapped (peers unmap freed buffers, Close
// the rest). make unit runs it under -race too (RACE_PKGS).
func TestRegisteredSoak(t *testing.T) {
	url := startNATS(t)
	ctx := context.Background()
	const n, block, iters = 3, 96 << 10, 60
	comms := group(t, url, n, nil)
	rng := rand.New(rand.NewPCG(25, 1))
	pools := make([][]*soakBuf, n)
	var gens []uint64
	alloc := func(r int) {
		mem, err := AllocBuffer(n * block)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := comms[r].Register(mem)
		if err != nil {
			t.Fatal(err)
		}
		pools[r] = append(pools[r], &soakBuf{mem: mem, regs: []Registration{reg}, gen: reg.gen})
		gens = append(gens, reg.gen)
	}
	// churn changes rank r's pool at random: a new buffer, a registration
	// more or less, or a free (refused while registered).
	churn := func(r int) {
		if len(pools[r]) < 2 {
			alloc(r)
			return
		}
		b := pools[r][rng.IntN(len(pools[r]))]
		switch rng.IntN(4) {
		case 0:
			alloc(r)
		case 1:
			reg, err := comms[r].Register(b.mem)
			if err != nil {
				t.Fatal(err)
			}
			b.regs = append(b.regs, reg)
		case 2:
			if len(b.regs) > 0 {
				if err := comms[r].Deregister(b.regs[len(b.regs)-1]); err != nil {
					t.Fatalf("Deregister between calls: %v", err)
				}
				b.regs = b.regs[:len(b.regs)-1]
			}
		case 3:
			err := FreeBuffer(b.mem)
			switch {
			case len(b.regs) > 0 && !errors.Is(err, ErrInvalidArgument):
				t.Fatalf("FreeBuffer of a registered buffer: %v, want ErrInvalidArgument", err)
			case len(b.regs) == 0 && err != nil:
				t.Fatalf("FreeBuffer of a deregistered buffer: %v", err)
			case len(b.regs) == 0:
				pools[r] = slices.DeleteFunc(pools[r], func(e *soakBuf) bool { return e == b })
			}
		}
	}
	// pick is a buffer for one call: a registered one, or the heap.
	pick := func(r int) []byte {
		var regd []*soakBuf
		for _, b := range pools[r] {
			if len(b.regs) > 0 {
				regd = append(regd, b)
			}
		}
		if len(regd) == 0 || rng.IntN(4) == 0 {
			return make([]byte, n*block)
		}
		b := regd[rng.IntN(len(regd))]
		clear(b.mem)
		return b.mem[:n*block]
	}
	send, recv := make([][]byte, n), make([][]byte, n)
	for it := range iters {
		for r := range n {
			churn(r)
			send[r], recv[r] = pick(r), pick(r)
			for send[r] != nil && len(recv[r]) > 0 && &send[r][0] == &recv[r][0] {
				recv[r] = make([]byte, n*block)
			}
			for i := range send[r] {
				send[r][i] = byte(it + 31*r + i*5 + i>>10)
			}
		}
		var err error
		switch op := it % 3; op {
		case 0:
			mustAll(t, onAll(comms, func(c *Comm) error { return c.AllToAll(ctx, send[c.Rank()], recv[c.Rank()]) }))
			for r := range n {
				for src := range n {
					if !bytes.Equal(recv[r][src*block:(src+1)*block], send[src][r*block:(r+1)*block]) {
						t.Fatalf("call %d, alltoall: rank %d's block from rank %d differs", it, r, src)
					}
				}
			}
		case 1:
			mustAll(t, onAll(comms, func(c *Comm) error { return c.AllReduce(ctx, send[c.Rank()], recv[c.Rank()], Int64, Sum) }))
			for r := range n {
				if err = checkSum(recv[r], send, 0); err != nil {
					t.Fatalf("call %d, allreduce, rank %d: %v", it, r, err)
				}
			}
		case 2:
			mustAll(t, onAll(comms, func(c *Comm) error { return c.AllGather(ctx, send[c.Rank()][:block], recv[c.Rank()]) }))
			for r := range n {
				for src := range n {
					if !bytes.Equal(recv[r][src*block:(src+1)*block], send[src][:block]) {
						t.Fatalf("call %d, allgather: rank %d's block of rank %d differs", it, r, src)
					}
				}
			}
		}
	}
	var live []Registration
	for r := range n {
		for _, b := range pools[r] {
			live = append(live, b.regs...)
		}
	}
	if peerMapped(t, live) == 0 {
		t.Errorf("peers mapped none of the %d live registered buffers", len(live))
	}
	for r := range n {
		for _, b := range pools[r] {
			for _, reg := range b.regs {
				if err := comms[r].Deregister(reg); err != nil {
					t.Fatal(err)
				}
			}
			if err := FreeBuffer(b.mem); err != nil {
				t.Fatal(err)
			}
		}
		if err := comms[r].Close(); err != nil {
			t.Fatal(err)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		if bytes.Contains(maps, []byte("/memfd:"+transport.SharedName(g)+" ")) {
			t.Errorf("buffer of generation %d still mapped after FreeBuffer and Close", g)
		}
	}
}
