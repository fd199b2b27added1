package tcp

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Transport is one rank's set of authenticated TCP streams to every peer. It
// implements transport.Transport. Its conns may be driven from any goroutines
// (one per direction per conn at a time); Wait is meant for the progress
// goroutine that drives them.
type Transport struct {
	l       *Listener
	rank    int
	size    int
	streams int
	conns   []*conn // by peer*streams + stream; nil for this rank
	sent    []atomic.Uint64
	recvd   []atomic.Uint64

	epfd      int
	waker     *transport.Waker // in the epoll set; nil until made
	guard     transport.Guard  // protects epfd, and waker for Wait
	noPwait2  atomic.Bool      // the kernel lacks epoll_pwait2: Wait rounds up to milliseconds
	closedErr error

	closeOnce sync.Once
	closeErr  error
}

var _ transport.Transport = (*Transport)(nil)

// newTransport takes over the authenticated connections tcs (by peer*Streams +
// stream; nil for this rank): it detaches their descriptors from Go's poller
// and registers them in a fresh epoll set. It closes every tcs entry, also on
// error.
func newTransport(l *Listener, tcs []*net.TCPConn) (*Transport, error) {
	cfg := &l.cfg
	t := &Transport{
		l:         l,
		rank:      cfg.Rank,
		size:      cfg.Size,
		streams:   cfg.Streams,
		conns:     make([]*conn, len(tcs)),
		sent:      make([]atomic.Uint64, cfg.Size),
		recvd:     make([]atomic.Uint64, cfg.Size),
		epfd:      -1,
		closedErr: fault.New(fault.ErrClosed, -1, "tcp: transport closed"),
	}
	fail := func(i int, err error) (*Transport, error) {
		for _, tc := range tcs[i:] {
			if tc != nil {
				tc.Close()
			}
		}
		t.Close()
		return nil, fault.Wrap(fault.ErrClosed, -1, err, "tcp: setting up the transport")
	}
	var err error
	if t.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fail(0, err)
	}
	if t.waker, err = transport.NewWaker(); err != nil {
		return fail(0, err)
	}
	// The eventfd is level-triggered: a Wake before Wait still ends that Wait.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(t.waker.FD())}
	if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, t.waker.FD(), &ev); err != nil {
		return fail(0, err)
	}
	for i, tc := range tcs {
		if tc == nil {
			continue
		}
		fd, err := detach(tc)
		if err != nil {
			return fail(i+1, err)
		}
		peer := i / t.streams
		c := &conn{
			fd:        fd,
			peer:      peer,
			stream:    i % t.streams,
			sent:      &t.sent[peer],
			recvd:     &t.recvd[peer],
			closedErr: fault.New(fault.ErrClosed, peer, "tcp: transport closed"),
		}
		t.conns[i] = c
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
		if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fail(i+1, err)
		}
	}
	return t, nil
}

// detach returns a non-blocking duplicate of tc's descriptor and closes tc,
// which takes the socket out of Go's poller while the duplicate keeps it open.
func detach(tc *net.TCPConn) (int, error) {
	defer tc.Close()
	rc, err := tc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Name is "tcp".
func (t *Transport) Name() string { return "tcp" }

// Streams is the number of streams per peer pair.
func (t *Transport) Streams() int { return t.streams }

// Conn returns the stream-th stream to peer. It panics when peer is this rank
// or either index is out of range: that is a bug in the caller.
func (t *Transport) Conn(peer, stream int) transport.Conn {
	if peer < 0 || peer >= t.size || peer == t.rank || stream < 0 || stream >= t.streams {
		panic(fmt.Sprintf("tcp: rank %d has no stream %d to rank %d (world %d, %d streams)", t.rank, stream, peer, t.size, t.streams))
	}
	return t.conns[peer*t.streams+stream]
}

// Wait parks until a stream may progress, Wake is called, or timeout passes
// (rounded up to a millisecond; timeout <= 0 polls once). Streams are
// edge-triggered: a stream reports readiness once per change, so the caller
// must have tried every pending op (each returning not done) since its last
// Wait, or it may sleep through data that is already there.
func (t *Transport) Wait(timeout time.Duration) error {
	if err := t.guard.Enter(t.closedErr); err != nil {
		return err
	}
	defer t.guard.Release()
	var evs [16]unix.EpollEvent
	n, err := transport.EpollWait(t.epfd, evs[:], timeout, &t.noPwait2)
	if err != nil {
		if err == unix.EINTR {
			return nil
		}
		return fault.Wrap(fault.ErrClosed, -1, err, "tcp: epoll_wait")
	}
	for i := range n {
		if evs[i].Fd == int32(t.waker.FD()) {
			t.waker.Clear()
		}
	}
	return nil
}

// Wake makes a concurrent or the next Wait return at once. It is safe from any
// goroutine, also after Close.
func (t *Transport) Wake() { t.waker.Wake() }

// Stats returns the bytes moved per peer (frame headers included) and the
// connections the listener refused.
func (t *Transport) Stats() transport.Stats {
	s := transport.CounterStats(t.sent, t.recvd)
	s.Rejected = t.l.Rejected()
	return s
}

// Close closes the listener, every stream and the epoll set. It is
// idempotent. Operations on the streams fail with fault.ErrClosed afterwards;
// peers see the connections close and fail with fault.ErrPeerLost.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.l.shutdown()
		var errs []error
		for _, c := range t.conns {
			if c != nil {
				errs = append(errs, c.close())
			}
		}
		if t.guard.Shut() {
			if t.waker != nil {
				t.guard.Drain(t.waker.Wake)
				errs = append(errs, t.waker.Close())
			} else {
				t.guard.Drain(nil)
			}
			if t.epfd >= 0 {
				errs = append(errs, unix.Close(t.epfd))
			}
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// PollFD is the transport's epoll set: readable when Wait would return, so a
// composed transport can sleep on it together with other parts' descriptors.
func (t *Transport) PollFD() int { return t.epfd }
