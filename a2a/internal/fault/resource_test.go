package fault

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestLocalResource(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string // a word of the name, or "" for none
	}{
		{&os.SyscallError{Syscall: "socket", Err: syscall.EMFILE}, "RLIMIT_NOFILE"},
		{fmt.Errorf("accept: %w", syscall.ENFILE), "file-max"},
		{&os.PathError{Op: "fallocate", Path: "/dev/shm/x", Err: syscall.ENOSPC}, "space"},
		{&os.SyscallError{Syscall: "mmap", Err: syscall.EAGAIN}, "RLIMIT_MEMLOCK"},
		{&os.SyscallError{Syscall: "connect", Err: syscall.EAGAIN}, "ports"},
		{&os.SyscallError{Syscall: "read", Err: syscall.EAGAIN}, ""},
		{syscall.ECONNREFUSED, ""},
		{errors.New("other"), ""},
		{nil, ""},
	} {
		got := LocalResource(tc.err)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("LocalResource(%v) = %q, want one naming %q", tc.err, got, tc.want)
		}
	}
	e := Exhausted(3, &os.SyscallError{Syscall: "socket", Err: syscall.EMFILE}, "tcp: dialing rank %d", 1)
	if !errors.Is(e, ErrResource) || KindOf(e) != ErrResource || e.Rank != 3 ||
		!strings.Contains(e.Error(), "(rank 3): tcp: dialing rank 1: out of file descriptors") {
		t.Errorf("Exhausted: %v", e)
	}
}
