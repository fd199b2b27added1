package a2a

import (
	"unsafe"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// hugePage is the transparent huge page size on x86-64 and arm64 (4 KiB
// base pages).
const hugePage = 2 << 20

// AllocBuffer returns n zeroed bytes for collective buffers, as MPI_Alloc_mem
// or ncclMemAlloc do: a shared memory file (memfd) of n bytes rounded up to
// 2 MiB, sealed against resizing, mapped at a 2 MiB aligned address and
// advised to use huge pages. The buffer is registered from birth:
//
//   - Ranks of this host map it once and copy from it with plain loads
//     instead of process_vm_readv, which pins every page it reads on every
//     call (the shm transport's mapped copies). Peers map it read-only, and
//     read it only while an operation that sends from it is in flight.
//   - The verbs transport sends from it without copying (it registers the
//     mapping with the device once; Go heap memory it must copy).
//
// Comm.Register pins it against FreeBuffer. Free it with FreeBuffer; the
// garbage collector does not. A forked child
// shares its pages instead of copying them. Errors wrap ErrInvalidArgument,
// or ErrResource when memory or file descriptors run out.
func AllocBuffer(n int) ([]byte, error) {
	if n <= 0 || n > 1<<46 {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "AllocBuffer(%d): need 1 <= n <= 2^46", n)
	}
	return transport.AllocShared(n, hugePage)
}

// FreeBuffer releases a buffer from AllocBuffer (any reslicing that keeps
// its start and capacity), deregistering it from every RDMA device that
// registered it. Using the buffer afterwards faults. It fails with
// ErrInvalidArgument, and frees nothing, for a slice AllocBuffer did not
// return, a buffer a Comm.Register registration holds (Deregister first),
// and a buffer an operation in flight still sends from (a peer may be
// reading it).
func FreeBuffer(b []byte) error {
	if cap(b) == 0 {
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: empty slice")
	}
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(b))); p%hugePage != 0 || cap(b)%hugePage != 0 {
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: %d-byte slice at %#x is not from AllocBuffer", cap(b), p)
	}
	// Transports deregister it from their devices before it goes.
	return transport.FreeShared(b)
}
