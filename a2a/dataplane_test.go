package a2a

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/a2a/transport/tcp"
)

// joinAll joins n ranks with cfg(r) and returns the comms or every error.
func joinAll(t *testing.T, n int, cfg func(r int) Config) ([]*Comm, []error) {
	t.Helper()
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			comms[r], errs[r] = Join(ctx, cfg(r))
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	return comms, errs
}

// TestTransportPerPair checks the choice of every pair's data plane: shm
// inside a host, TCP across hosts, each forced one where it can serve, and
// a forced one that cannot link a pair failing every rank's Join with an
// error naming the pair, never a hang.
func TestTransportPerPair(t *testing.T) {
	url := startNATS(t)
	for _, tc := range []struct {
		name      string
		transport string
		perHost   int
		want      string // every rank's TransportName
		wantLocal string // the link class that prices ranks of one host
		wantErr   string // substring of every rank's Join error
	}{
		{name: "one host", perHost: 4, want: "shm", wantLocal: "shm"},
		{name: "two hosts", perHost: 2, want: "shm+tcp", wantLocal: "shm"},
		{name: "one per host", perHost: 1, want: "tcp", wantLocal: "shm"},
		{name: "forced tcp", transport: "tcp", perHost: 4, want: "tcp", wantLocal: "tcp"},
		{name: "forced shm across hosts", transport: "shm", perHost: 2, wantErr: "is on another host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := fmt.Sprintf("pp%d", time.Now().UnixNano())
			comms, errs := joinAll(t, 4, func(r int) Config {
				return Config{NATSURL: url, Group: group, Rank: r, WorldSize: 4, Transport: tc.transport, Logger: discard,
					Host: fmt.Sprintf("host%d", r/tc.perHost)}
			})
			for r, err := range errs {
				switch {
				case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
					t.Errorf("rank %d: %v, want an error with %q", r, err, tc.wantErr)
				case tc.wantErr == "" && err != nil:
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			if tc.wantErr != "" {
				return
			}
			for r, c := range comms {
				if got := c.TransportName(); got != tc.want {
					t.Errorf("rank %d: TransportName %q, want %q", r, got, tc.want)
				}
				if l := c.Links(); l != BuiltinLinks().Table(tc.wantLocal, "tcp") {
					t.Errorf("rank %d: links %+v, want the built-in %s/tcp table", r, l, tc.wantLocal)
				}
				for p := range 4 {
					want := "tcp"
					switch {
					case p == r:
						want = ""
					case tc.transport == "" && p/tc.perHost == r/tc.perHost:
						want = "shm"
					}
					if got := c.PeerTransport(p); got != want {
						t.Errorf("rank %d peer %d: %q, want %q", r, p, got, want)
					}
				}
			}
			checkAllToAll(t, comms)
		})
	}
}

// checkAllToAll runs one verified AllToAll on comms.
func checkAllToAll(t *testing.T, comms []*Comm) {
	t.Helper()
	n := len(comms)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			send, recv := make([]byte, 3*n), make([]byte, 3*n)
			for i := range send {
				send[i] = byte(r*31 + i)
			}
			if errs[r] = c.AllToAll(context.Background(), send, recv); errs[r] != nil {
				return
			}
			for p := range n {
				for k := range 3 {
					if want := byte(p*31 + 3*r + k); recv[3*p+k] != want {
						errs[r] = fmt.Errorf("byte %d from rank %d: %d, want %d", k, p, recv[3*p+k], want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// unavailable is a provider that cannot serve anywhere, as verbs on a
// machine without a device.
type unavailable struct{}

var errNoDevice = errors.New("no device")

func (unavailable) Name() string                         { return "nodev" }
func (unavailable) Capabilities() transport.Capabilities { return transport.Capabilities{} }
func (unavailable) Listen(context.Context, transport.Self) (transport.Endpoint, error) {
	return nil, errNoDevice
}

// TestProviderList checks that a provider is one entry in Config.Providers:
// under auto selection one that cannot serve is left out and the next one
// links the pairs; forced, it fails Join at once with its reason.
func TestProviderList(t *testing.T) {
	url := startNATS(t)
	providers := []transport.Provider{unavailable{}, shm.Provider{}, tcp.Provider{}}
	group := fmt.Sprintf("pl%d", time.Now().UnixNano())
	comms, errs := joinAll(t, 2, func(r int) Config {
		return Config{NATSURL: url, Group: group, Rank: r, WorldSize: 2, Providers: providers, Logger: discard}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if got := comms[r].TransportName(); got != "shm" {
			t.Errorf("rank %d: %q, want shm", r, got)
		}
	}
	checkAllToAll(t, comms)

	start := time.Now()
	_, err := Join(context.Background(), Config{NATSURL: url, Group: group + "f", Rank: 0, WorldSize: 2,
		Providers: providers, Transport: "nodev", Logger: discard})
	if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, errNoDevice) {
		t.Errorf("forced unavailable provider: %v, want ErrInvalidArgument wrapping its reason", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("forced unavailable provider failed after %v, want at once", d)
	}
	if _, err := Join(context.Background(), Config{NATSURL: url, WorldSize: 2, Providers: providers, Transport: "verbs"}); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "nodev, shm, tcp") {
		t.Errorf("unknown transport: %v, want ErrInvalidArgument listing the providers", err)
	}
}
