//go:build linux

package main

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsg builds one control message as the kernel lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func TestCmsgTimestamp(t *testing.T) {
	ts := unix.Timespec{Sec: 1700000000, Nsec: 123456789}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&ts)), unsafe.Sizeof(ts))
	want := int64(1700000000)*1e9 + 123456789
	stamp := cmsg(unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS, raw)
	other := cmsg(unix.SOL_PACKET, unix.PACKET_AUXDATA, make([]byte, 20))
	for name, c := range map[string]struct {
		b    []byte
		want int64
	}{
		"alone":       {stamp, want},
		"after other": {append(append([]byte{}, other...), stamp...), want},
		"none":        {other, 0},
		"empty":       {nil, 0},
		"truncated":   {stamp[:len(stamp)-8], 0},
	} {
		if got := cmsgTimestamp(c.b); got != c.want {
			t.Errorf("%s: %d, want %d", name, got, c.want)
		}
	}
}
