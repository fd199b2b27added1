package tcp

import (
	"net"
	"os"
	"testing"

	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// TestMain fails the run if goroutines or descriptors outlive the tests: every
// listener, hello, dialer and transport must be gone after Close.
func TestMain(m *testing.M) {
	// The runtime opens its poller's descriptors on first network use; open
	// them before taking the baseline.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	os.Exit(transporttest.RunLeakChecked(m))
}
