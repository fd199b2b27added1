package transporttest

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// RunLeakChecked runs the tests of m and fails the run (a non-zero code) if
// goroutines or file descriptors outlive them, waiting up to 3 s for ones
// that are shutting down. Take care of lazily opened runtime descriptors
// (the poller) before calling it. It is meant for TestMain:
// os.Exit(transporttest.RunLeakChecked(m)). A fuzzing run (-fuzz) is not
// checked: the fuzzing engine keeps a signal-handling goroutine of its own.
func RunLeakChecked(m *testing.M) int {
	goroutines, fds := runtime.NumGoroutine(), openFDs()
	code := m.Run()
	if code != 0 {
		return code
	}
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return 0
	}
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) && (runtime.NumGoroutine() > goroutines || openFDs() > fds) {
		time.Sleep(10 * time.Millisecond)
	}
	if g, f := runtime.NumGoroutine(), openFDs(); g > goroutines || f > fds {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "leak: %d goroutines (started with %d), %d descriptors (started with %d)\n%s\n",
			g, goroutines, f, fds, buf[:runtime.Stack(buf, true)])
		return 1
	}
	return 0
}

func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}
