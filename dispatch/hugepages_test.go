package dispatch

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestLargeBuffersAskForHugePages: a step buffer that spans an aligned
// 2 MiB page is advised to use huge pages there (the kernel marks the
// mapping "hg" in /proc/self/smaps, whatever the system's THP policy), so
// that process_vm_readv pins few pages.
func TestLargeBuffersAskForHugePages(t *testing.T) {
	for _, size := range []int{4 << 20, 5<<20 + 123, 64 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			b := largeBytes(size)
			const huge = 2 << 20
			page := (uintptr(unsafe.Pointer(&b[0])) + huge - 1) &^ (huge - 1) // the first aligned page in b
			flags, err := vmFlags(page)
			if err != nil {
				t.Fatal(err)
			}
			if !hasFlag(flags, "hg") {
				t.Errorf("%d-byte buffer: mapping flags %q lack the huge-page advice hg", size, flags)
			}
		})
	}
}

// vmFlags returns the VmFlags line of the mapping of /proc/self/smaps that
// holds addr.
func vmFlags(addr uintptr) (string, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			in = lo <= addr && addr < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmFlags:")), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no mapping holds %#x", addr)
}

// mappingRange parses the address range of a mapping's first smaps line.
func mappingRange(line string) (lo, hi uintptr, ok bool) {
	r, _, found := strings.Cut(line, " ")
	a, b, dash := strings.Cut(r, "-")
	if !found || !dash {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(a, 16, 64)
	h, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}

func hasFlag(flags, flag string) bool {
	for _, f := range strings.Fields(flags) {
		if f == flag {
			return true
		}
	}
	return false
}
