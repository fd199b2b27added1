package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Listener states.
const (
	stateIdle       = iota // listening; connections wait in the kernel backlog
	stateConnecting        // Connect is running: hellos are served
	stateConnected         // every slot is filled: all further hellos are refused
	stateClosed
)

// Listener is one rank's data-plane listener. Open it with Listen before
// rendezvous, publish Addr, then call Connect once with every rank's address.
type Listener struct {
	cfg      Config
	log      *slog.Logger
	ln       *net.TCPListener
	rejected atomic.Uint64

	mu      sync.Mutex
	state   int
	epoch   uint32
	slots   []*net.TCPConn // accepted connections by (dialer-rank-1)*Streams + stream
	linked  []bool         // by rank: the ranks Connect links (those with an address)
	filled  chan struct{}  // one token per slot whose hello completed
	starved chan error     // the accept loop ran out of a local resource (one error, buffered)
	pending map[*net.TCPConn]struct{}
	wg      sync.WaitGroup // the accept loop and every hello in progress

	closeOnce sync.Once
	closeErr  error
}

// Listen validates cfg and opens the data-plane listener. No connection is
// served until Connect: until then dialers wait in the kernel's backlog.
func Listen(cfg Config) (*Listener, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: bufferControl(cfg.SocketBuffer)}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fault.Wrap(fault.ErrInvalidArgument, cfg.Rank, err, "tcp: listening on %s", cfg.ListenAddr)
	}
	return &Listener{
		cfg:     cfg,
		log:     cfg.Logger.With("rank", cfg.Rank),
		ln:      ln.(*net.TCPListener),
		pending: make(map[*net.TCPConn]struct{}),
	}, nil
}

// SetRank sets this rank when it was not known at Listen (ranks assigned at
// rendezvous, after the address was published). It must precede Connect.
func (l *Listener) SetRank(rank int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateIdle {
		return fault.New(fault.ErrInvalidArgument, rank, "tcp: SetRank after Connect")
	}
	if rank < 0 || rank >= l.cfg.Size {
		return fault.New(fault.ErrInvalidArgument, rank, "tcp: rank %d outside world of size %d", rank, l.cfg.Size)
	}
	l.cfg.Rank = rank
	l.log = l.cfg.Logger.With("rank", rank)
	return nil
}

// Addr is the host:port peers dial; publish it at rendezvous.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Rejected is the number of connections refused so far: strangers, malformed
// or unauthenticated hellos, wrong group or epoch, duplicates, timeouts.
func (l *Listener) Rejected() uint64 { return l.rejected.Load() }

// Close closes a listener whose Connect was never called or failed. After a
// successful Connect the Transport owns the listener and closes it.
func (l *Listener) Close() error {
	l.shutdown()
	return l.closeErr
}

// shutdown stops serving: it closes the listening socket and every hello in
// progress, waits for their goroutines, and closes accepted connections that
// no Transport took over. It is idempotent.
func (l *Listener) shutdown() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.state = stateClosed
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
		if err := l.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			l.closeErr = err
		}
		l.wg.Wait()
		for i, c := range l.slots {
			if c != nil {
				c.Close()
				l.slots[i] = nil
			}
		}
	})
}

// Connect links this rank with its peers: Streams connections per pair, the
// higher rank dialing the lower one, each authenticated by the hello. peers[r]
// is the Addr of rank r, or "" for a rank another transport reaches (and
// peers[Rank] is ignored); both ranks of a pair must agree on whether they
// are linked. It returns once every connection is up. Errors: fault.ErrTimeout (or fault.ErrAborted if ctx is
// cancelled) when ctx ends first, naming the lowest missing rank;
// fault.ErrPeerLost when a peer keeps refusing connections for
// HandshakeTimeout; fault.ErrMismatch when a peer refuses our hello (other
// group or epoch) or fails authentication (other secret). On error the
// listener is closed too. Connect may be called once.
func (l *Listener) Connect(ctx context.Context, epoch uint32, peers []string) (*Transport, error) {
	cfg := &l.cfg
	if cfg.Rank < 0 {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "tcp: Connect before the rank is known (SetRank)")
	}
	if len(peers) != cfg.Size {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "tcp: %d peer addresses for a world of %d", len(peers), cfg.Size)
	}
	linked := make([]bool, cfg.Size)
	nAccept := 0
	for r, a := range peers {
		linked[r] = r != cfg.Rank && a != ""
		if linked[r] && r > cfg.Rank {
			nAccept += cfg.Streams
		}
	}
	l.mu.Lock()
	switch l.state {
	case stateClosed:
		l.mu.Unlock()
		return nil, fault.New(fault.ErrClosed, -1, "tcp: Connect on a closed listener")
	case stateIdle:
	default:
		l.mu.Unlock()
		return nil, fault.New(fault.ErrInvalidArgument, -1, "tcp: Connect called twice")
	}
	l.state = stateConnecting
	l.epoch = epoch
	l.slots = make([]*net.TCPConn, (cfg.Size-1-cfg.Rank)*cfg.Streams)
	l.filled = make(chan struct{}, nAccept)
	l.starved = make(chan error, 1)
	l.linked = linked
	l.wg.Add(1)
	l.mu.Unlock()
	go l.acceptLoop()

	t, err := l.connect(ctx, epoch, peers, nAccept)
	if err != nil {
		l.shutdown()
		return nil, err
	}
	l.log.Debug("tcp: connected", "epoch", epoch, "size", cfg.Size, "streams", cfg.Streams)
	return t, nil
}

func (l *Listener) connect(ctx context.Context, epoch uint32, peers []string, nAccept int) (*Transport, error) {
	cfg := &l.cfg
	S := cfg.Streams
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type dialed struct {
		peer, stream int
		c            *net.TCPConn
		err          error
	}
	nDial := 0
	for p := range cfg.Rank {
		if l.linked[p] {
			nDial += S
		}
	}
	results := make(chan dialed, nDial)
	for p := 0; p < cfg.Rank; p++ {
		for s := 0; s < S && l.linked[p]; s++ {
			go func() {
				c, err := l.dial(dctx, epoch, p, s, peers[p])
				results <- dialed{p, s, c, err}
			}()
		}
	}
	out := make([]*net.TCPConn, cfg.Rank*S) // dialed connections by peer*S + stream
	// collect waits for the dialers still running and closes what they return,
	// so that no goroutine or socket outlives a failed Connect.
	collect := func(left int) {
		cancel()
		for ; left > 0; left-- {
			if r := <-results; r.c != nil {
				r.c.Close()
			}
		}
		for _, c := range out {
			if c != nil {
				c.Close()
			}
		}
	}
	accepted := 0
	for left := nDial; left > 0 || accepted < nAccept; {
		select {
		case r := <-results:
			left--
			if r.err != nil {
				if ctx.Err() != nil {
					r.err = l.missing(ctx, out)
				}
				collect(left)
				return nil, r.err
			}
			out[r.peer*S+r.stream] = r.c
		case <-l.filled:
			accepted++
		case err := <-l.starved:
			// The peers dialing us wait in the backlog for an accept that
			// cannot come: this rank fails, so they are not left to blame
			// each other or time out.
			collect(left)
			return nil, err
		case <-ctx.Done():
			err := l.missing(ctx, out)
			collect(left)
			return nil, err
		}
	}

	l.mu.Lock()
	l.state = stateConnected
	slots := l.slots
	l.slots = nil
	l.mu.Unlock()
	tcs := make([]*net.TCPConn, cfg.Size*S) // by peer*S + stream
	copy(tcs, out)
	copy(tcs[(cfg.Rank+1)*S:], slots)
	t, err := newTransport(l, tcs)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// missing builds the error for a Connect that ctx ended, naming the ranks
// whose connections are not up (dialed holds this rank's dialed connections).
func (l *Listener) missing(ctx context.Context, dialed []*net.TCPConn) error {
	S := l.cfg.Streams
	var ranks []int
	for p := 0; p < l.cfg.Rank; p++ {
		for s := 0; s < S && l.linked[p]; s++ {
			if dialed[p*S+s] == nil {
				ranks = append(ranks, p)
				break
			}
		}
	}
	l.mu.Lock()
	for i := 0; i < len(l.slots); i += S {
		for s := 0; s < S && l.linked[l.cfg.Rank+1+i/S]; s++ {
			if l.slots[i+s] == nil {
				ranks = append(ranks, l.cfg.Rank+1+i/S)
				break
			}
		}
	}
	l.mu.Unlock()
	first := -1
	if len(ranks) > 0 {
		first = ranks[0]
	}
	return ctxError(ctx, first, "tcp: rank %d connecting, waiting for ranks %v", l.cfg.Rank, ranks)
}

// ctxError maps the end of ctx to a fault kind: a deadline is ErrTimeout, a
// cancellation ErrAborted. The context error stays matchable.
func ctxError(ctx context.Context, rank int, format string, args ...any) error {
	kind := fault.ErrTimeout
	if errors.Is(ctx.Err(), context.Canceled) {
		kind = fault.ErrAborted
	}
	return fault.Wrap(kind, rank, context.Cause(ctx), format, args...)
}

// dial establishes and authenticates stream s to the lower rank peer. A peer
// whose kernel accepts but whose process does not answer yet (it has not
// reached Connect) is retried until ctx ends; a peer that refuses or resets
// connections for HandshakeTimeout is lost.
func (l *Listener) dial(ctx context.Context, epoch uint32, peer, s int, addr string) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: l.cfg.HandshakeTimeout, Control: bufferControl(l.cfg.SocketBuffer)}
	h := hello{
		group:    l.cfg.Group,
		epoch:    epoch,
		dialer:   uint32(l.cfg.Rank),
		acceptor: uint32(peer),
		stream:   uint32(s),
	}
	backoff := time.Millisecond
	var downSince time.Time
	for {
		c, alive, permanent, err := l.dialOnce(ctx, &d, &h, addr)
		switch {
		case err == nil:
			return c, nil
		case fault.LocalResource(err) != "":
			// Our own shortage, not the peer's silence: retrying it as a peer
			// not up yet would end in blaming a healthy rank.
			return nil, fault.Exhausted(l.cfg.Rank, err, "tcp: rank %d dialing rank %d stream %d", l.cfg.Rank, peer, s)
		case ctx.Err() != nil:
			return nil, ctxError(ctx, peer, "tcp: dialing rank %d stream %d at %s", peer, s, addr)
		case permanent:
			return nil, fault.Wrap(fault.ErrMismatch, peer, err, "tcp: rank %d stream %d at %s", peer, s, addr)
		case alive:
			downSince = time.Time{}
		case downSince.IsZero():
			downSince = time.Now()
		case time.Since(downSince) > l.cfg.HandshakeTimeout:
			return nil, fault.Wrap(fault.ErrPeerLost, peer, err, "tcp: rank %d at %s unreachable", peer, addr)
		}
		l.log.Debug("tcp: retrying dial", "peer", peer, "stream", s, "err", err)
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctxError(ctx, peer, "tcp: dialing rank %d stream %d at %s", peer, s, addr)
		case <-timer.C:
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// dialOnce makes one attempt. alive reports that the peer's kernel accepted
// the connection and the hello then timed out: the peer exists but has not
// started serving.
func (l *Listener) dialOnce(ctx context.Context, d *net.Dialer, h *hello, addr string) (c *net.TCPConn, alive, permanent bool, err error) {
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, false, err
	}
	tc := nc.(*net.TCPConn)
	deadline := time.Now().Add(l.cfg.HandshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	tc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Now()) })
	permanent, err = dialHello(tc, l.cfg.Secret, h)
	if !stop() && err == nil {
		// ctx ended: the deadline may be cut under us at any moment.
		err = context.Cause(ctx)
	}
	if err == nil {
		err = l.ready(tc)
	}
	if err != nil {
		tc.Close()
		var ne net.Error
		return nil, errors.As(err, &ne) && ne.Timeout(), permanent, err
	}
	return tc, false, false, nil
}

// ready clears the hello deadline and disables Nagle on an authenticated
// connection.
func (l *Listener) ready(c *net.TCPConn) error {
	if err := c.SetDeadline(time.Time{}); err != nil {
		return err
	}
	return c.SetNoDelay(true)
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var failures acceptBackoff
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			l.mu.Lock()
			closed := l.state == stateClosed
			l.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			l.acceptFailed(err, &failures)
			continue
		}
		failures = acceptBackoff{}
		l.mu.Lock()
		if l.state == stateClosed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.pending[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c)
	}
}

// acceptBackoff paces an accept loop that keeps failing: the pause doubles
// up to a second, and the failure is logged once per interval with how many
// were not.
type acceptBackoff struct {
	pause    time.Duration
	logged   time.Time
	unlogged int
}

// acceptLogEvery is how often a failing accept loop logs.
const acceptLogEvery = 5 * time.Second

// acceptFailed handles a failed accept: out of a local resource (descriptors),
// the Connect in progress fails with ErrResource for this rank; anything else
// (a connection reset in the backlog) is passed over. Either way the loop
// keeps serving, but does not spin or flood the log.
func (l *Listener) acceptFailed(err error, b *acceptBackoff) {
	if fault.LocalResource(err) != "" {
		select {
		case l.starved <- fault.Exhausted(l.cfg.Rank, err, "tcp: rank %d accepting its peers' connections", l.cfg.Rank):
		default: // told already
		}
	}
	if now := time.Now(); now.Sub(b.logged) >= acceptLogEvery {
		l.log.Warn("tcp: accept failed", "err", err, "failures_not_logged", b.unlogged)
		b.logged, b.unlogged = now, 0
	} else {
		b.unlogged++
	}
	b.pause = min(max(2*b.pause, 10*time.Millisecond), time.Second)
	time.Sleep(b.pause)
}

// serve runs the acceptor side of one hello. Every connection gets its own
// goroutine and deadline, so a slow stranger cannot delay a real peer.
func (l *Listener) serve(c *net.TCPConn) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
	}()
	c.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	h, err := readHello(c)
	if err != nil {
		l.reject(c, nil, err)
		return
	}
	slot, status := l.check(&h)
	if status != statusOK {
		c.Write([]byte{status})
		l.reject(c, &h, errors.New(statusText(status)))
		return
	}
	if err := acceptAuth(c, l.cfg.Secret, &h); err != nil {
		l.reject(c, &h, err)
		return
	}
	// Reserve the slot before the ack, so that of two authenticated hellos for
	// one slot exactly one is told it succeeded.
	l.mu.Lock()
	if l.state != stateConnecting || l.slots[slot] != nil {
		l.mu.Unlock()
		c.Write([]byte{statusDuplicate})
		l.reject(c, &h, errors.New(statusText(statusDuplicate)))
		return
	}
	l.slots[slot] = c
	l.mu.Unlock()
	if _, err := c.Write([]byte{statusOK}); err == nil {
		err = l.ready(c)
	}
	if err != nil {
		l.mu.Lock()
		if l.slots[slot] == c {
			l.slots[slot] = nil
		}
		l.mu.Unlock()
		l.reject(c, &h, err)
		return
	}
	l.log.Debug("tcp: accepted", "peer", h.dialer, "stream", h.stream, "remote", c.RemoteAddr().String())
	l.filled <- struct{}{}
}

// check validates a hello against this listener and returns the slot it
// claims.
func (l *Listener) check(h *hello) (int, byte) {
	cfg := &l.cfg
	if h.group != cfg.Group {
		return 0, statusBadGroup
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case h.epoch != l.epoch:
		return 0, statusBadEpoch
	case h.acceptor != uint32(cfg.Rank) || h.dialer <= uint32(cfg.Rank) || h.dialer >= uint32(cfg.Size) ||
		h.stream >= uint32(cfg.Streams):
		return 0, statusBadRank
	}
	slot := (int(h.dialer)-cfg.Rank-1)*cfg.Streams + int(h.stream)
	switch {
	case l.state != stateConnecting || l.slots[slot] != nil:
		return 0, statusDuplicate
	case !l.linked[h.dialer]: // another transport reaches it
		return 0, statusBadRank
	}
	return slot, statusOK
}

// reject closes a connection whose hello failed and counts it, unless the
// failure is the listener shutting down.
func (l *Listener) reject(c *net.TCPConn, h *hello, err error) {
	c.Close()
	l.mu.Lock()
	closing := l.state == stateClosed
	l.mu.Unlock()
	if closing {
		return
	}
	n := l.rejected.Add(1)
	attrs := []any{"remote", c.RemoteAddr().String(), "reason", err.Error(), "rejected", n}
	if h != nil {
		attrs = append(attrs, "claimed_rank", h.dialer, "stream", h.stream, "epoch", h.epoch)
	}
	l.log.Info("tcp: refused connection", attrs...)
}

// bufferControl sets the socket buffers before connect or listen, so that the
// TCP window scale negotiated in the SYN accounts for them (accepted sockets
// inherit the listener's).
func bufferControl(size int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		if size < 0 {
			return nil
		}
		var serr error
		err := rc.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, size); serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
			}
		})
		if err == nil && serr != nil {
			err = fmt.Errorf("setting socket buffers to %d bytes: %w", size, serr)
		}
		return err
	}
}
