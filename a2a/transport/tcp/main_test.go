package tcp

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the run if goroutines or descriptors outlive the tests: every
// listener, hello, dialer and transport must be gone after Close.
func TestMain(m *testing.M) {
	// The runtime opens its poller's descriptors on first network use; open
	// them before taking the baseline.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	goroutines, fds := runtime.NumGoroutine(), openFDs()
	code := m.Run()
	if code == 0 {
		end := time.Now().Add(3 * time.Second)
		for time.Now().Before(end) && (runtime.NumGoroutine() > goroutines || openFDs() > fds) {
			time.Sleep(10 * time.Millisecond)
		}
		if g, f := runtime.NumGoroutine(), openFDs(); g > goroutines || f > fds {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "leak: %d goroutines (started with %d), %d descriptors (started with %d)\n%s\n",
				g, goroutines, f, fds, buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}

func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}
