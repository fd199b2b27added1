package verbs

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// Transport is one rank's RC queue pairs to its peers on one device port.
// It implements transport.Transport, transport.Poller (the completion
// channel, through an epoll set with the wake-up eventfd) and
// transport.Slots (the LL window, stored into by RDMA WRITE) with
// transport.SlotWatcher.
//
// All progress happens under one mutex: the completion queue is shared by
// every QP, and whichever call polls it hands each completion to its
// stream. Calls from several goroutines are therefore safe; the engine
// drives everything from one.
type Transport struct {
	rank, size, streams int
	geo                 geometry
	dev                 *device
	log                 *slog.Logger
	conns               []*conn // by peer*streams+stream; nil where no peer
	zcopy               int     // payload from which AllocBuffer memory goes zero-copy; 0: never

	mu        sync.Mutex
	wc        [32]ibv.WC
	pool      pool
	regs      []registration // AllocBuffer mappings registered for zero-copy
	recvIDs   []uint64       // scratch of repostRecvs
	recvSGEs  []ibv.SGE
	stopWatch func()
	closing   bool   // Close has begun: flushed work requests are expected
	hellos    bool   // Connect's hello phase: a hello that timed out is sent again
	seen      uint64 // completions handled so far
	ll        llState

	guard     transport.Guard // protects epfd, and waker for Wait
	epfd      int
	waker     *transport.Waker // in the epoll set; nil until made
	armed     bool
	noPwait2  atomic.Bool
	sent      []atomic.Uint64
	recvd     []atomic.Uint64
	closedErr error
	closeOnce sync.Once
	closeErr  error
}

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.Poller      = (*Transport)(nil)
	_ transport.Slots       = (*Transport)(nil)
	_ transport.SlotWatcher = (*Transport)(nil)
)

// registration is an AllocBuffer mapping registered with the device.
type registration struct {
	base uintptr
	size int
	mr   *ibv.MR
}

// Work request ids: the conn index in the low 32 bits, the kind above, and
// the kind's detail (a bounce buffer) in the top 24.
type wrKind uint8

const (
	wrRecv   wrKind = iota
	wrBounce        // a chunk from bounce buffer (detail)
	wrZCopy         // a chunk straight from AllocBuffer memory
	wrInline        // a frame copied into the work request
	wrCredit        // a credit return without data
	wrLL            // an LL store
	wrHello
	wrBye
)

func wrID(conn int, k wrKind, detail int) uint64 {
	return uint64(uint32(conn)) | uint64(k)<<32 | uint64(detail)<<40
}

func splitWR(id uint64) (conn int, k wrKind, detail int) {
	return int(uint32(id)), wrKind(id >> 32), int(id >> 40)
}

// The immediate of every RDMA WRITE WITH IMM: the credits it returns for
// the opposite direction of its stream in the low bits, and what it is.
const (
	immCredits = 0xffff
	immLL      = 1 << 31 // an LL store: it only wakes the target
	immBye     = 1 << 30 // the sender closed its transport
	immHello   = 1 << 29 // the hello, in ring slot 0
)

func newTransport(e *endpoint, d *device, g transport.Group, peers []int, remotes []remoteEndpoint) (t *Transport, err error) {
	S := e.geo.Streams
	t = &Transport{
		rank: g.Rank, size: g.Size, streams: S, geo: e.geo, dev: d, log: e.self.Logger,
		conns: make([]*conn, g.Size*S), epfd: -1,
		sent: make([]atomic.Uint64, g.Size), recvd: make([]atomic.Uint64, g.Size),
		closedErr: fault.New(fault.ErrClosed, -1, "verbs: transport closed"),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	switch z := e.p.ZCopyBytes; {
	case z == 0:
		t.zcopy = DefaultZCopyBytes
	case z > 0:
		t.zcopy = z
	}
	defer func() {
		if err != nil {
			t.closeFDs()
			t.dev = nil // the caller closes the device
		}
	}()
	if t.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fault.Wrap(fault.ErrClosed, -1, err, "verbs: epoll set")
	}
	if t.waker, err = transport.NewWaker(); err != nil {
		return nil, fault.Wrap(fault.ErrClosed, -1, err, "verbs: eventfd")
	}
	for _, fd := range []int{t.waker.FD(), d.ch.Fd()} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return nil, fault.Wrap(fault.ErrClosed, -1, err, "verbs: epoll set")
		}
	}
	t.pool.init(d.bounce, e.geo.ChunkBytes)
	K, C := e.geo.RingSlots, e.geo.ChunkBytes
	t.recvIDs, t.recvSGEs = make([]uint64, rqDepth(K)), make([]ibv.SGE, rqDepth(K))
	for _, q := range peers {
		re := remotes[q]
		for s := range S {
			i := q*S + s
			c := &conn{
				t: t, idx: i, peer: q, stream: s, qp: d.qps[i],
				raddr:    re.RingAddr + uint64((g.Rank*S+s)*K*C),
				rkey:     re.RingKey,
				ring:     d.rings.mem[i*K*C : (i+1)*K*C],
				rlen:     make([]int, K),
				ctl:      d.ctl.mem[i*ctlBytes : (i+1)*ctlBytes],
				ctlAddr:  d.ctl.mr.Addr() + uint64(i*ctlBytes),
				rposted:  rqDepth(K),
				remote:   remoteAddr(re, g.Rank, s, S),
				closedEr: fault.New(fault.ErrClosed, q, "verbs: transport closed"),
			}
			t.conns[i] = c
		}
	}
	t.ll.init(t, remotes)
	t.stopWatch = transport.WatchBuffers(t.release)
	// Armed from the start: a Mixed transport may sleep on PollFD before
	// this transport's first Wait.
	if err := d.cq.Arm(false); err != nil {
		t.stopWatch()
		return nil, err
	}
	t.armed = true
	return t, nil
}

// helloMAC is what the hello of stream s from src to dst carries.
func helloMAC(secret []byte, group string, epoch uint32, src, dst, s int) []byte {
	m := hmac.New(sha256.New, secret)
	var b [16]byte
	binary.LittleEndian.PutUint32(b[0:], epoch)
	binary.LittleEndian.PutUint32(b[4:], uint32(src))
	binary.LittleEndian.PutUint32(b[8:], uint32(dst))
	binary.LittleEndian.PutUint32(b[12:], uint32(s))
	m.Write([]byte("a2a verbs hello\x00" + group + "\x00"))
	m.Write(b[:])
	return m.Sum(nil)
}

// hello sends every peer's QP its MAC into ring slot 0 and waits for every
// peer's, checking it, within ctx. A peer whose QP is not up yet has the
// hello retried by the device for about a second (connectOptions); one that
// takes longer (a rank descheduled under load) has it sent again on a fresh
// connection: the QP goes back through RESET to RTS with the same first PSN,
// so a peer that did take the first hello sees the second as a duplicate.
func (t *Transport) hello(ctx context.Context, group string, secret []byte, epoch uint32) error {
	t.mu.Lock()
	t.hellos = true
	for _, c := range t.conns {
		if c == nil {
			continue
		}
		c.helloWant = helloMAC(secret, group, epoch, c.peer, t.rank, c.stream)
		copy(c.ctl[ctlHello:], helloMAC(secret, group, epoch, t.rank, c.peer, c.stream))
		if err := c.sendHello(); err != nil {
			t.mu.Unlock()
			return err
		}
	}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.hellos = false
		t.mu.Unlock()
	}()
	for {
		t.mu.Lock()
		err := t.poll()
		left := 0
		for _, c := range t.conns {
			if c == nil {
				continue
			}
			if err == nil && c.helloAgain {
				err = c.reconnect()
			}
			if err == nil && c.lost != nil {
				err = c.lost
			}
			if !c.helloSent || !c.helloGot {
				left++
			}
		}
		t.mu.Unlock()
		if err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fault.Wrap(fault.ErrTimeout, -1, err, "verbs: %d streams have not said hello", left)
		}
		if err := t.Wait(10 * time.Millisecond); err != nil {
			return err
		}
	}
}

// Name is "verbs".
func (t *Transport) Name() string { return "verbs" }

// Streams is the number of streams per peer pair.
func (t *Transport) Streams() int { return t.streams }

// Conn returns the stream-th stream to peer. It panics for a peer this
// transport does not reach: a bug in the caller.
func (t *Transport) Conn(peer, stream int) transport.Conn {
	if peer < 0 || peer >= t.size || stream < 0 || stream >= t.streams || t.conns[peer*t.streams+stream] == nil {
		panic("verbs: no such stream")
	}
	return t.conns[peer*t.streams+stream]
}

// Device is the port this transport uses.
func (t *Transport) Device() ibv.Endpoint { return t.dev.ep }

// PollFD is an epoll set that becomes readable when the completion channel
// reports a completion or Wake is called. The CQ is kept armed between
// calls, so a composed transport may sleep on it without calling Wait
// first.
func (t *Transport) PollFD() int { return t.epfd }

// poll takes every completion the CQ holds and hands each to its stream.
// Called with t.mu held.
func (t *Transport) poll() error {
	for {
		n, err := t.dev.cq.Poll(t.wc[:])
		if err != nil {
			return fault.Wrap(fault.ErrClosed, -1, err, "verbs: polling the completion queue")
		}
		for i := range n {
			t.complete(&t.wc[i])
		}
		t.seen += uint64(n)
		for _, c := range t.conns {
			if c != nil && c.repost >= repostBatch {
				c.repostRecvs()
			}
		}
		if n < len(t.wc) {
			return nil
		}
	}
}

// complete handles one completion.
func (t *Transport) complete(wc *ibv.WC) {
	ci, kind, detail := splitWR(wc.ID)
	if ci < 0 || ci >= len(t.conns) || t.conns[ci] == nil {
		return
	}
	c := t.conns[ci]
	if t.hellos && wc.Status != ibv.WCSuccess && (c.helloAgain || wc.Status == ibv.WCWRFlushErr ||
		kind == wrHello && wc.Status == ibv.WCRetryExcErr) {
		// A hello timed out: the QP is in error and flushes its receives;
		// reconnect sets it up again. Flushes of the old receives may
		// trail the reset and are dropped.
		if kind == wrHello {
			c.sqOut--
			c.helloAgain = true
		}
		return
	}
	if kind == wrRecv {
		c.rposted--
		c.repost++
	} else {
		c.sqOut--
		switch kind {
		case wrBounce:
			t.pool.put(detail)
		case wrZCopy:
			c.zpend--
		case wrHello:
			c.helloSent = wc.Status == ibv.WCSuccess
		}
	}
	if err := wc.Err(); err != nil {
		c.gone = true
		if !t.closing {
			c.fail(fault.Wrap(fault.ErrPeerLost, c.peer, err, "verbs: stream %d to rank %d", c.stream, c.peer))
		}
		return
	}
	if kind != wrRecv {
		return
	}
	imm := uint32(0)
	if wc.Flags&ibv.WCWithImm != 0 {
		imm = wc.Imm()
	}
	c.returned += uint64(imm & immCredits)
	switch {
	case imm&immBye != 0:
		c.gone = true
		c.fail(fault.New(fault.ErrPeerLost, c.peer, "verbs: rank %d closed its transport (stream %d)", c.peer, c.stream))
	case imm&immLL != 0:
		// The data is in the window already; the completion only woke us.
	case imm&immHello != 0:
		c.gotHello(int(wc.ByteLen))
	case wc.ByteLen > 0:
		c.rlen[c.rin%uint64(len(c.rlen))] = int(wc.ByteLen)
		c.rin++
	}
}

// Wait parks until a completion arrives, Wake is called, or timeout passes
// (timeout <= 0 polls once). It arms the CQ, polls once more (a completion
// that came before the arming raises no event), then sleeps on the
// completion channel and the wake-up eventfd; no wake-up is lost. It leaves
// the CQ armed.
func (t *Transport) Wait(timeout time.Duration) error {
	if err := t.guard.Enter(t.closedErr); err != nil {
		return err
	}
	defer t.guard.Release()
	t.mu.Lock()
	moved, err := t.rearm()
	t.mu.Unlock()
	if err != nil || moved || timeout <= 0 {
		return err
	}
	var evs [4]unix.EpollEvent
	if _, err := transport.EpollWait(t.epfd, evs[:], timeout, &t.noPwait2); err != nil && err != unix.EINTR {
		return fault.Wrap(fault.ErrClosed, -1, err, "verbs: epoll_wait")
	}
	t.waker.Clear()
	t.mu.Lock()
	_, err = t.rearm()
	t.mu.Unlock()
	return err
}

// rearm reads the channel's events, arms the CQ if an event disarmed it,
// and polls; it reports whether anything completed: in this poll, or since
// the CQ was last armed, as a drained event says. The latter's completion
// may have been taken by a poll outside Wait (another stream's TryRecv, a
// Load or Stored of another peer) after the caller last looked at the
// stream it is for, and the event that would have ended the sleep is gone:
// sleeping on would lose that wake-up until the timeout. Called with t.mu
// held.
func (t *Transport) rearm() (bool, error) {
	n, err := t.dev.ch.Drain()
	if err != nil {
		return false, fault.Wrap(fault.ErrClosed, -1, err, "verbs: completion channel")
	}
	if n > 0 || !t.armed {
		if err := t.dev.cq.Arm(false); err != nil {
			t.armed = false
			return false, fault.Wrap(fault.ErrClosed, -1, err, "verbs: arming the completion queue")
		}
		t.armed = true
	}
	before := t.seen
	if err := t.poll(); err != nil {
		return false, err
	}
	return n > 0 || t.seen != before, nil
}

// Wake makes a concurrent or the next Wait return at once. It is safe from
// any goroutine, also after Close.
func (t *Transport) Wake() { t.waker.Wake() }

// Stats returns the bytes moved per peer: frame headers and payloads, LL
// slots as the words stored.
func (t *Transport) Stats() transport.Stats {
	return transport.CounterStats(t.sent, t.recvd)
}

// Close tells every peer goodbye (so theirs fail at once with ErrPeerLost
// instead of after the retries), then destroys the QPs, deregisters every
// memory region, destroys the CQ and completion channel and frees the PD
// and device context. It is idempotent; operations fail with ErrClosed
// afterwards.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.guard.Shut()
		// Wait refuses once the guard is shut; one still sleeping is woken
		// until it is gone, and only then are the descriptors closed.
		t.guard.Drain(t.waker.Wake)
		t.closeErr = t.shutdown()
	})
	return t.closeErr
}

func (t *Transport) shutdown() error {
	if t.stopWatch != nil {
		t.stopWatch()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// A peer that closed first said goodbye already: no need to answer.
	t.poll()
	t.closing = true
	pending := 0
	for _, c := range t.conns {
		if c == nil || c.gone || c.sqOut >= sqDepth(c.slots()) {
			continue
		}
		if c.post(ibv.SendWR{ID: wrID(c.idx, wrBye, 0), Op: ibv.OpRDMAWriteWithImm, Flags: ibv.SendSignaled,
			Imm: immBye, RemoteAddr: c.raddr, RKey: c.rkey}, nil) == nil {
			pending++
		}
	}
	// Give the goodbyes (and what was posted before them) a moment to
	// leave: a QP destroyed at once drops what it has not sent, and a first
	// packet the peer dropped is retried only after the ACK timeout.
	for end := time.Now().Add(byeWait); pending > 0 && time.Now().Before(end); {
		if t.poll() != nil {
			break
		}
		pending = 0
		for _, c := range t.conns {
			if c != nil && c.sqOut > 0 && !c.gone {
				pending++
			}
		}
		if pending > 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	var errs []error
	for i := range t.conns {
		t.conns[i] = nil
	}
	errs = append(errs, t.dev.dropQPs(func(int) bool { return false }))
	for _, r := range t.regs {
		if r.mr != nil {
			errs = append(errs, r.mr.Close())
		}
	}
	t.regs = nil
	errs = append(errs, t.dev.close())
	t.closeFDs()
	if err := errors.Join(errs...); err != nil {
		return fault.Wrap(fault.ErrClosed, -1, err, "verbs: close")
	}
	return nil
}

// byeWait bounds how long Close waits for its goodbyes to be acknowledged:
// longer than two ACK timeouts (connectOptions), so that a goodbye queued
// behind a retried packet still leaves; a dead peer never acknowledges.
const byeWait = 400 * time.Millisecond

func (t *Transport) closeFDs() {
	if t.epfd >= 0 {
		unix.Close(t.epfd)
		t.epfd = -1
	}
	if t.waker != nil {
		t.waker.Close() // kept: Wake may still come
	}
}

// release deregisters what this transport registered of an AllocBuffer
// mapping that FreeBuffer is about to unmap.
func (t *Transport) release(base uintptr, size int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := 0; i < len(t.regs); {
		r := t.regs[i]
		if r.base >= base && r.base < base+uintptr(size) {
			if r.mr != nil {
				r.mr.Close()
			}
			t.regs = append(t.regs[:i], t.regs[i+1:]...)
			continue
		}
		i++
	}
}

// lookupMR returns the registration that covers data if data lies in an
// AllocBuffer mapping, registering the mapping on first use, or nil: the
// data must then be copied. A mapping that fails to register is remembered
// as such, so the failure costs one attempt and one warning. Called with
// t.mu held.
func (t *Transport) lookupMR(data []byte) *ibv.MR {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	for i := range t.regs {
		if r := &t.regs[i]; p >= r.base && p-r.base+uintptr(len(data)) <= uintptr(r.size) {
			if i > 0 { // the most recent first: a collective reuses its buffers
				t.regs[0], t.regs[i] = t.regs[i], t.regs[0]
			}
			return t.regs[0].mr
		}
	}
	base, size, ok := transport.FindBuffer(p, len(data))
	if !ok {
		return nil
	}
	start := unsafe.Add(unsafe.Pointer(unsafe.SliceData(data)), -int(p-base))
	mr, err := t.dev.pd.RegMR(unsafe.Slice((*byte)(start), size), ibv.AccessLocalWrite)
	if err != nil {
		t.log.Warn("verbs: registering an AllocBuffer mapping failed, copying from it instead", "bytes", size, "err", err)
		mr = nil
	}
	t.regs = append([]registration{{base: base, size: size, mr: mr}}, t.regs...)
	return mr
}
