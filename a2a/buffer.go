package a2a

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// hugePage is the transparent huge page size on x86-64 and arm64 (4 KiB
// base pages).
const hugePage = 2 << 20

// AllocBuffer returns n zeroed bytes for collective buffers, as MPI_Alloc_mem
// or ncclMemAlloc do: an anonymous mapping aligned to and rounded up to
// 2 MiB and advised to use transparent huge pages (MADV_HUGEPAGE; the
// kernel's default on most distributions backs only advised memory with
// them). Large transfers gain: shared memory copies between processes with
// process_vm_readv, which pins every page it reads, and 4 KiB pages make that
// dominate (2 ranks, 1 MiB AllToAll: 170-177 us from AllocBuffer against
// 203-228 us from the Go heap; Open MPI 191 us), and the verbs transport
// sends from it without copying (it registers the mapping with the device
// once; Go heap memory it must copy). Free it with FreeBuffer;
// the garbage collector does not. Errors wrap ErrInvalidArgument.
func AllocBuffer(n int) ([]byte, error) {
	if n <= 0 || n > 1<<46 {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "AllocBuffer(%d): need 1 <= n <= 2^46", n)
	}
	size := (n + hugePage - 1) &^ (hugePage - 1)
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size+hugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fault.Wrap(fault.ErrInvalidArgument, -1, err, "AllocBuffer(%d)", n)
	}
	// Keep the aligned middle; return the unaligned head and the tail.
	head := (hugePage - uintptr(p)%hugePage) % hugePage
	if head > 0 {
		unix.MunmapPtr(p, head)
	}
	start := unsafe.Add(p, head)
	unix.MunmapPtr(unsafe.Add(start, size), hugePage-head) // head < hugePage: never empty
	b := unsafe.Slice((*byte)(start), size)
	// Only advice: without THP the buffer still works with base pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	// RDMA may send from it without copying: the verbs transport registers
	// it on first use.
	transport.AddBuffer(b)
	return b[:n:size], nil
}

// FreeBuffer releases a buffer from AllocBuffer (any reslicing that keeps
// its start and capacity), deregistering it from every RDMA device that
// registered it. Using the buffer afterwards faults. A slice that
// AllocBuffer did not return fails with ErrInvalidArgument.
func FreeBuffer(b []byte) error {
	if cap(b) == 0 {
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: empty slice")
	}
	all := unsafe.Slice(unsafe.SliceData(b), cap(b))
	if uintptr(unsafe.Pointer(&all[0]))%hugePage != 0 || cap(b)%hugePage != 0 {
		return fault.New(fault.ErrInvalidArgument, -1, "FreeBuffer: %d-byte slice at %p is not from AllocBuffer", cap(b), &all[0])
	}
	// Transports deregister it from their devices before it goes.
	transport.RemoveBuffer(all)
	if err := unix.MunmapPtr(unsafe.Pointer(&all[0]), uintptr(len(all))); err != nil {
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "FreeBuffer")
	}
	return nil
}
