package a2a

import (
	"net"
	"testing"
)

// TestDefaultListen: with no A2A_LISTEN a rank listens on the address of
// its host that routes to the NATS server, so ranks of other hosts can reach
// it; a server on loopback (or an address that cannot be parsed) keeps the
// data plane on loopback.
func TestDefaultListen(t *testing.T) {
	for _, server := range []string{"127.0.0.1:4222", "[::1]:4222", "nats.example:4222", "garbage"} {
		if got := defaultListen(server); got != "127.0.0.1:0" {
			t.Errorf("defaultListen(%q) = %q, want 127.0.0.1:0", server, got)
		}
	}
	own := map[string]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			own[n.IP.String()] = true
		}
	}
	// A documentation address (TEST-NET-1): the route to it is the default
	// route's, when there is one; no packet is sent.
	got := defaultListen("192.0.2.1:4222")
	host, port, err := net.SplitHostPort(got)
	if err != nil || port != "0" || (got != "127.0.0.1:0" && !own[host]) {
		t.Errorf("defaultListen(192.0.2.1:4222) = %q, want port 0 on an address of this host %v", got, own)
	}
	t.Logf("192.0.2.1:4222 is reached from %s", got)
}
