// Package tcp is the TCP data plane of a2a: every peer pair is linked by
// Config.Streams authenticated TCP connections, and payloads move between user
// buffers and sockets with non-blocking sendmsg/readv syscalls issued by the
// engine's progress goroutine, with no allocations, and no copies above 4 KiB:
// a smaller frame is staged in a contiguous buffer of its stream and moves
// with one send or recv, which costs the kernel less than an iovec.
//
// Lifecycle: Listen opens the data-plane listener before rendezvous so that its
// address can be published on the control plane; Connect then links this rank
// with every peer (the higher rank of a pair dials the lower one) and returns a
// *Transport. Every connection opens with a mutually authenticated hello (HMAC
// over both sides' nonces with the group secret); strangers are refused and
// counted, before and after Connect, without disturbing running operations.
//
// After the hello a socket leaves Go's network poller: the transport owns a
// duplicate of its descriptor, registers it in its own epoll set, and issues its
// own syscalls. The runtime poller would otherwise wake an idle thread for every
// frame that arrives, a wake-up the engine never asked for and that costs a core
// on small machines.
package tcp

import (
	"log/slog"
	"math"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Defaults applied by Listen to a zero Config field.
const (
	DefaultListenAddr       = "127.0.0.1:0"
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultSocketBuffer     = 4 << 20
)

// Limits of the hello encoding.
const (
	maxGroupLen = 1024
	maxStreams  = math.MaxUint16 + 1 // the frame header's stream field is a u16
)

// Config configures one rank's TCP transport. Group, Size, Streams and Secret
// must be identical on every rank of a job.
type Config struct {
	Group   string // job name; part of the authenticated hello
	Rank    int    // this rank, in [0, Size); -1 until assigned (see Listener.SetRank)
	Size    int    // world size
	Streams int    // connections per peer pair (>= 1; 0 means 1)
	Secret  []byte // group secret keying HMAC-SHA256; must not be empty

	// ListenAddr is the data-plane listen address (default DefaultListenAddr).
	// Addr reports the bound address, so listen on a concrete interface
	// address, not a wildcard, when peers live on other hosts.
	ListenAddr string
	// HandshakeTimeout bounds each connection's hello (default
	// DefaultHandshakeTimeout). It is also how long a dialer keeps retrying a
	// peer that refuses connections before declaring it lost.
	HandshakeTimeout time.Duration
	// SocketBuffer sets SO_SNDBUF and SO_RCVBUF in bytes (0 means
	// DefaultSocketBuffer; negative leaves the kernel's autotuning alone).
	SocketBuffer int
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
}

// normalize validates c and fills in defaults.
func (c Config) normalize() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fault.New(fault.ErrInvalidArgument, -1, "tcp: "+format, args...)
	}
	switch {
	case c.Size < 1:
		return bad("world size %d", c.Size)
	case c.Rank < -1 || c.Rank >= c.Size:
		return bad("rank %d outside world of size %d", c.Rank, c.Size)
	case uint64(c.Size) > math.MaxUint32:
		return bad("world size %d too large", c.Size)
	case c.Streams < 0 || c.Streams > maxStreams:
		return bad("%d streams per peer (want 1..%d)", c.Streams, maxStreams)
	case len(c.Secret) == 0:
		return bad("empty group secret")
	case len(c.Group) > maxGroupLen:
		return bad("group name of %d bytes (max %d)", len(c.Group), maxGroupLen)
	case c.HandshakeTimeout < 0:
		return bad("negative handshake timeout %v", c.HandshakeTimeout)
	}
	if c.Streams == 0 {
		c.Streams = 1
	}
	if c.ListenAddr == "" {
		c.ListenAddr = DefaultListenAddr
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.SocketBuffer == 0 {
		c.SocketBuffer = DefaultSocketBuffer
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	// The caller may reuse its slice; the transport keeps its own copy.
	c.Secret = append([]byte(nil), c.Secret...)
	return c, nil
}
