package shm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

const testEpoch = transporttest.Epoch

// testRing is the ring size of most tests: small, so that frames wrap often
// and messages larger than the ring are cheap.
const testRing = 64 << 10

// Transfer modes: every message through the rings, or every non-empty
// message by CMA.
const (
	ringOnly = -1
	cmaAll   = 1
)

func modeName(z int) string {
	if z == ringOnly {
		return "ring"
	}
	return "cma"
}

// testGroup returns a group name no other test (or test process) uses.
func testGroup(t testing.TB) string {
	return fmt.Sprintf("shm-test/%s/%d/%x", t.Name(), os.Getpid(), rand.Uint64())
}

func testConfig(t testing.TB, group string, rank, size, streams, zcopy int) Config {
	return Config{
		Group:          group,
		Epoch:          testEpoch,
		Rank:           rank,
		Size:           size,
		Streams:        streams,
		RingBytes:      testRing,
		ZCopyThreshold: zcopy,
		Logger:         transporttest.Logger(t),
	}
}

// groupFiles lists the segment files of group in dir.
func groupFiles(t testing.TB, dir, group string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, groupPrefix(group)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkNoFiles fails the test if any segment file of group is left in dir.
func checkNoFiles(t testing.TB, dir, group string) {
	t.Helper()
	if files := groupFiles(t, dir, group); len(files) > 0 {
		t.Errorf("segment files left in %s: %v", dir, files)
		for _, f := range files {
			os.Remove(f)
		}
	}
}

// openAll runs Open for every config concurrently, as the local ranks of a
// job would.
func openAll(ctx context.Context, cfgs []Config) ([]*Transport, []error) {
	ts := make([]*Transport, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { ts[i], errs[i] = Open(ctx, cfg) })
	}
	wg.Wait()
	return ts, errs
}

// newCluster opens n in-process ranks with the given streams and transfer
// mode, closed at cleanup, which also checks that no segment file is left.
func newCluster(t testing.TB, n, streams, zcopy int, mutate ...func(*Config)) []*Transport {
	t.Helper()
	group := testGroup(t)
	cfgs := make([]Config, n)
	for r := range n {
		cfgs[r] = testConfig(t, group, r, n, streams, zcopy)
		for _, m := range mutate {
			m(&cfgs[r])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, errs := openAll(ctx, cfgs)
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
		checkNoFiles(t, cfgs[0].Dir, group)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Open rank %d: %v", r, err)
		}
	}
	// Segments are unlinked once everyone attached, before Open returns.
	if files := groupFiles(t, DefaultDir, group); len(files) > 0 {
		t.Fatalf("segment files still linked after Open: %v", files)
	}
	return ts
}

// The progress-loop harness is shared with every transport's tests.
type job = transporttest.Job

var (
	sendJob  = transporttest.SendJob
	recvJob  = transporttest.RecvJob
	pattern  = transporttest.Pattern
	hdr      = transporttest.Hdr
	firstErr = transporttest.FirstErr
)

func drive(tr *Transport, jobs []job, timeout time.Duration) error {
	return transporttest.Drive(tr, jobs, timeout)
}

func driveAll(ts []*Transport, jobs [][]job, timeout time.Duration) []error {
	return transporttest.DriveAll(ts, jobs, timeout)
}

// published reports whether the segment file at path has a complete header.
func published(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, headerBytes)
	_, err = f.ReadAt(b, 0)
	return err == nil && decodeInfo(b).magic == segMagic
}

// waitPublished waits until group has exactly one segment file in dir, with
// a complete header, and returns its path.
func waitPublished(t testing.TB, dir, group string) string {
	t.Helper()
	var files []string
	if !transporttest.WaitFor(10*time.Second, func() bool {
		files = groupFiles(t, dir, group)
		return len(files) == 1 && published(files[0])
	}) {
		t.Fatalf("no published segment of the group in %s: %v", dir, files)
	}
	return files[0]
}
