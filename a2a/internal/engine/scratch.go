package engine

import (
	"slices"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// sharedScratchMin is the smallest scratch the engine makes shareable.
// Below it the partial sums a ring sends from scratch go through the
// rings anyway (shm maps a buffer from its ZCopyThreshold, 8 KiB, on), so
// a memfd would only cost a descriptor.
const sharedScratchMin = 64 << 10

// scratchAlign aligns a shareable scratch as AllocBuffer aligns the user's:
// 2 MiB, so the kernel may back it with huge pages.
const scratchAlign = 2 << 20

// scratchState is BufScratch: heap memory, or a shareable mapping
// (transport.AllocShared) when a peer shares this rank's host. A ring
// ReduceScatter above 2 ranks sends partial sums from scratch; from a
// shareable mapping a peer on this host maps them once and reduces them
// where they lie, as it does the user's registered buffers in the first
// round, instead of receiving each into its own scratch first.
type scratchState struct {
	buf    []byte
	shared bool // buf is from transport.AllocShared: Close frees it
}

// scratchFor returns n bytes of scratch, growing it when it is smaller. The
// old one is freed only here, between operations, so no peer still reads
// it: an operation ends with every send's acknowledgment.
func (e *Engine) scratchFor(n int) []byte {
	s := &e.scr
	if cap(s.buf) >= n {
		return s.buf[:n]
	}
	e.freeScratch()
	if n >= sharedScratchMin && slices.Contains(e.op.sameHost, true) {
		if b, err := transport.AllocShared(n, scratchAlign); err == nil {
			s.buf, s.shared = b, true
			return b[:n]
		}
		// Out of descriptors or memfd refused: heap scratch still works,
		// its sends just go by CMA or the rings.
	}
	s.buf = make([]byte, n)
	return s.buf
}

// freeScratch releases a shareable scratch. FreeShared refuses one that a
// send still holds (an operation that failed with the send in flight and
// the transport still open); it is then left mapped, for the process's
// life, rather than freed under a peer that may read it.
func (e *Engine) freeScratch() {
	s := &e.scr
	if s.shared {
		_ = transport.FreeShared(s.buf)
	}
	s.buf, s.shared = nil, false
}

// Close releases what the engine holds beyond the Go heap: its shareable
// scratch. Call it once the transport is closed, or when no operation of
// the engine runs and none will.
func (e *Engine) Close() { e.freeScratch() }
