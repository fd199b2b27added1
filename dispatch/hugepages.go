package dispatch

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// adviseHuge asks the kernel to back the 2 MiB-aligned middle of b with
// transparent huge pages (MADV_HUGEPAGE: most distributions back only
// advised memory with them), as a2a.AllocBuffer does for mappings of its
// own. Only advice: b works the same without them.
func adviseHuge(b []byte) {
	const huge = 2 << 20
	if len(b) < 2*huge {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (p + huge - 1) &^ (huge - 1)
	hi := (p + uintptr(len(b))) &^ (huge - 1)
	_ = unix.Madvise(b[lo-p:hi-p], unix.MADV_HUGEPAGE)
}
