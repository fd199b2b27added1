package shm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// fullDirEnv makes the test binary a child that mounts a 64 KiB tmpfs on the
// directory it names, in a mount namespace of its own, and opens a
// transport there (fullDirMain).
const fullDirEnv = "A2A_SHM_FULLDIR"

// TestOpenFullDir: a rank whose segment does not fit in the shared-memory
// file system (a full /dev/shm) fails Open with ErrResource naming itself,
// the space it needs and the space there is, instead of invalid argument
// or a peer's fault. The file system is a tiny tmpfs in a private mount
// namespace (a user namespace too when not root), so nothing of the host
// is filled or mounted.
func TestOpenFullDir(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fullDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if os.Getuid() != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := string(out)
	t.Log(strings.TrimSpace(got))
	for _, want := range []string{"kind=out of resources", "(rank 1)", "out of space", "it needs", "KiB free"} {
		if !strings.Contains(got, want) {
			t.Errorf("child reported %q, want it to contain %q", got, want)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) > 0 {
		t.Errorf("left in %s: %v", dir, files)
	}
}

// fullDirMain is the child of TestOpenFullDir: it reports the kind and text
// of Open's error on stdout, or fails.
func fullDirMain(dir string) int {
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		os.Stdout.WriteString("mount: " + err.Error() + "\n")
		return 1
	}
	defer syscall.Unmount(dir, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := Open(ctx, Config{Group: "full", Epoch: testEpoch, Rank: 1, Size: 2, RingBytes: testRing, Dir: dir})
	if err == nil {
		tr.Close()
		os.Stdout.WriteString("Open succeeded in a 64 KiB file system\n")
		return 1
	}
	kind := fault.KindOf(err)
	if kind == nil || !errors.Is(err, fault.ErrResource) {
		os.Stdout.WriteString("error of the wrong kind: " + err.Error() + "\n")
		return 1
	}
	os.Stdout.WriteString("kind=" + strings.TrimPrefix(kind.Error(), "a2a: ") + " err=" + err.Error() + "\n")
	return 0
}
