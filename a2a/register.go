package a2a

import (
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Registration is a hold on a registered buffer, from Comm.Register; the
// zero value holds nothing.
type Registration struct {
	base uintptr
	gen  uint64
}

// Register makes buf a registered buffer for c's collectives and pins it:
// ranks of this host map the memory once (the first operation that sends
// from it) and copy from the mapping with plain loads, which on one host
// moves data at memcpy speed instead of process_vm_readv's. buf must lie in
// one buffer from AllocBuffer, whose memory is shareable (a memfd) and
// registered from birth: Register then checks that buf takes the fast path
// and keeps FreeBuffer from freeing it until Deregister. Other memory (the
// Go heap, foreign mappings) cannot be shared without a copy and fails with
// ErrInvalidArgument; it still works in every collective, by the kernel's
// cross-process copy. A buffer may be registered any number of times, and a
// registration serves every Comm of the process.
func (c *Comm) Register(buf []byte) (Registration, error) {
	if len(buf) == 0 {
		return Registration{}, fault.New(fault.ErrInvalidArgument, c.rank, "Register: empty buffer")
	}
	base, gen, err := transport.Pin(uintptr(unsafe.Pointer(unsafe.SliceData(buf))), len(buf))
	if err != nil {
		return Registration{}, err
	}
	return Registration{base: base, gen: gen}, nil
}

// Deregister releases a registration from Register; FreeBuffer may free
// the buffer once no registration holds it. It fails with
// ErrInvalidArgument for a registration released already (or the zero
// Registration), and while an operation still sends from the buffer (a
// peer may be reading it): the registration then stays.
func (c *Comm) Deregister(r Registration) error {
	if r.gen == 0 {
		return fault.New(fault.ErrInvalidArgument, c.rank, "Deregister: the zero Registration")
	}
	if err := transport.Unpin(r.base, r.gen); err != nil {
		return err
	}
	return nil
}
