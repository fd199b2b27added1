package shm

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// TestMain fails the run if goroutines, descriptors, mappings (of segments
// and of shareable buffers, own or peers') or segment files of this process
// outlive the tests.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	if dir := os.Getenv(fullDirEnv); dir != "" {
		os.Exit(fullDirMain(dir))
	}
	// The runtime opens its poller's descriptors when the os package first
	// opens a file (Open reads /proc); open them before taking the baseline.
	os.ReadFile("/proc/self/stat")
	code := transporttest.RunLeakChecked(m)
	if code == 0 {
		if n := segmentMappings(); n > 0 {
			fmt.Fprintf(os.Stderr, "leak: %d segment mappings left\n", n)
			code = 1
		}
		if n := sharedMappings(); n > 0 {
			fmt.Fprintf(os.Stderr, "leak: %d mappings of shareable buffers left\n", n)
			code = 1
		}
		if files := ownFiles(DefaultDir); len(files) > 0 {
			fmt.Fprintf(os.Stderr, "leak: segment files of this process left in %s: %v\n", DefaultDir, files)
			code = 1
		}
	}
	os.Exit(code)
}

// segmentMappings counts this process's mappings of segment files.
func segmentMappings() int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("/"+namePrefix))
}

// ownFiles lists the segment files in dir that this process created.
func ownFiles(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var own []string
	for _, e := range ents {
		if _, _, _, ok := parseName(e.Name()); !ok {
			continue
		}
		f, err := os.Open(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		b := make([]byte, headerBytes)
		if _, err := f.ReadAt(b, 0); err == nil && decodeInfo(b).pid == os.Getpid() {
			own = append(own, e.Name())
		}
		f.Close()
	}
	return own
}
