//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	vnetHdrLen = 10                      // struct virtio_net_hdr (PACKET_VNET_HDR)
	bigBuf     = vnetHdrLen + 65536 + 64 // a GSO super-frame (gso_max_size 64 KiB) fits
	smallBuf   = 2048                    // frames up to this are copied out of the receive buffer
	sockBuf    = 32 << 20                // SO_RCVBUF / SO_SNDBUF of every port
	readBatch  = 1024                    // frames read from one port in one pass at most
	ethPAll    = 0x0300                  // htons(ETH_P_ALL)
	retryNs    = 20_000                  // a port whose socket was full is tried again this much later
	stallNs    = 2_000_000               // a timer wake-up this late is reported as a stall
)

// port is one switch port: an AF_PACKET socket bound to an interface, and the queue of
// frames waiting for their due time to leave through it.
type port struct {
	name  string
	index int
	fd    int
	q     fifo

	rxFrames, rxBytes, txFrames, txBytes uint64
	dropQueue, dropSend                  uint64
	lastSendErr                          error
}

// sw is the switch; one goroutine (locked to its thread) runs it.
type sw struct {
	cfg   config
	ports []*port
	fdb   fdb

	// epIdle waits for frames (every port), the timer and the stop eventfd: the wait
	// when nothing is queued. epBusy waits for the timer and the stop eventfd only:
	// a frame arriving while others are queued is due after all of them (one delay for
	// all, counted from the kernel's receive timestamp), so it need not wake the
	// switch; the next timer wake-up reads it.
	epIdle, epBusy, tfd, stopfd int
	armed                       int64 // the timerfd's absolute expiry; 0 disarmed, -1 after it fired

	// The timer is armed margin before the earliest due frame and the switch spins the
	// rest. margin follows the 80th percentile of how long after the armed time the
	// switch is ready to send (timer wake-up plus reading the sockets), at most --spin.
	margin float64

	scratch    []byte   // the receive buffer
	small, big [][]byte // free buffers
	late, lag  hist     // sent - due; ready - timer expiry

	t0                                   int64
	wakeFrames, wakeTimer, spins, stalls uint64
	spinNs, writeNs, recvNs              int64
	flooded, filtered, runts, truncated  uint64
	msg                                  unix.Msghdr // recvmsg state, reused
	iov                                  unix.Iovec
	sa                                   unix.RawSockaddrLinklayer
	oob                                  [64]byte
}

func nowNs() int64 { return time.Now().UnixNano() }

func run(cfg config) error {
	// Die with the parent (the test bed script), even when it is killed outright.
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0)
	if os.Getppid() == 1 {
		return errors.New("parent already gone")
	}
	runtime.LockOSThread()
	// No garbage collection in steady state: the loop allocates next to nothing (pooled
	// buffers, reused queues), and a collection's stop-the-world would hold this thread
	// for as long as the collector's own (normal priority) threads wait for a core on a
	// busy machine. The memory limit is the safety net.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(1 << 30)
	s := &sw{cfg: cfg, fdb: fdb{}, epIdle: -1, epBusy: -1, tfd: -1, stopfd: -1}
	s.margin = float64(cfg.spin.Nanoseconds()) / 2
	defer s.close()
	if err := s.open(); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	go func() {
		<-sigs
		one := [8]byte{1}
		_, _ = unix.Write(s.stopfd, one[:])
	}()
	// The forwarding thread: a real-time priority when asked, and no timer slack (it
	// does not apply to the timerfd, but to any timed wait the kernel does for us).
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	if cfg.rtprio > 0 {
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(cfg.rtprio)}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			fmt.Fprintf(os.Stderr, "delayswitch: SCHED_FIFO %d: %v (normal scheduling)\n", cfg.rtprio, err)
		}
	}
	names := make([]string, len(s.ports))
	for i, p := range s.ports {
		names[i] = p.name
	}
	fmt.Fprintf(os.Stderr, "delayswitch: ready: %d ports (%s), one-way delay %v, spin %v, queue %d frames/port, rtprio %d\n",
		len(s.ports), strings.Join(names, ","), cfg.delay, cfg.spin, cfg.queue, cfg.rtprio)
	var ru0 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	t0 := time.Now()
	s.t0 = t0.UnixNano()
	err := s.loop()
	s.report(time.Since(t0), &ru0)
	return err
}

// open creates the ports, the epoll sets, the timerfd and the stop eventfd.
func (s *sw) open() error {
	var err error
	if s.epIdle, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if s.epBusy, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	// CLOCK_REALTIME: the clock of the kernel's receive timestamps (SO_TIMESTAMPNS).
	if s.tfd, err = unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return fmt.Errorf("timerfd_create: %w", err)
	}
	if s.stopfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	for _, ep := range []int{s.epIdle, s.epBusy} {
		for _, fd := range []int{s.tfd, s.stopfd} {
			if err := epollAdd(ep, fd); err != nil {
				return err
			}
		}
	}
	seen := map[string]bool{}
	for i, name := range s.cfg.ifaces {
		if seen[name] {
			return fmt.Errorf("port %s given twice", name)
		}
		seen[name] = true
		p, err := openPort(name)
		if err != nil {
			return err
		}
		p.index = i
		s.ports = append(s.ports, p)
		if err := epollAdd(s.epIdle, p.fd); err != nil {
			return err
		}
	}
	s.scratch = make([]byte, bigBuf)
	return nil
}

func epollAdd(ep, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

func (s *sw) close() {
	for _, p := range s.ports {
		_ = unix.Close(p.fd)
	}
	for _, fd := range []int{s.epIdle, s.epBusy, s.tfd, s.stopfd} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// openPort opens a raw packet socket on the interface: every frame in (promiscuous),
// with the virtio-net header and the kernel's receive timestamp, none of its own sends.
func openPort(name string) (*port, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("port %s: %w", name, err)
	}
	// Protocol 0 until bind: no frame of another interface slips in before it.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("port %s: AF_PACKET socket: %w", name, err)
	}
	fail := func(what string, err error) (*port, error) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("port %s: %s: %w", name, what, err)
	}
	// The virtio-net header carries GSO and checksum-offload state in and out, so a
	// 64 KiB TCP super-frame with a partial checksum leaves as it came, as through a
	// bridge (without it such frames could not be sent, and small ones would arrive
	// with bad checksums).
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return fail("PACKET_VNET_HDR", err)
	}
	// Linux >= 4.20; older kernels hand our own sends back, which recv drops by type.
	_ = unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail("SO_TIMESTAMPNS", err)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, sockBuf)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sockBuf)
	}
	mreq := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mreq); err != nil {
		return fail("promiscuous mode", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: ethPAll, Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	return &port{name: name, fd: fd}, nil
}

// loop forwards until the stop eventfd fires. Each pass reads every frame that has
// arrived, sends every frame that is due, and sleeps until margin before the next one is
// due (or, with nothing queued, until a frame arrives).
func (s *sw) loop() error {
	events := make([]unix.EpollEvent, 8)
	spinMax := float64(s.cfg.spin.Nanoseconds())
	var target int64 // the timer's expiry of the last timer wake-up
	timerWoke := false
	for {
		s.drainAll()
		now := nowNs()
		if timerWoke {
			timerWoke = false
			s.lag.add(now - target)
			if now-target > stallNs {
				s.stalls++
				if s.stalls <= 20 {
					fmt.Fprintf(os.Stderr, "delayswitch: stall: ready %.1f ms after the timer's expiry at +%.3fs\n",
						float64(now-target)/1e6, float64(now-s.t0)/1e9)
				}
			}
			// Track the 80th percentile of ready - target (a stochastic quantile step).
			if float64(now-target) > s.margin {
				s.margin += 1600
			} else {
				s.margin -= 400
			}
			s.margin = min(max(s.margin, 0), spinMax)
		}
		next := s.transmit(now)
		for next != 0 && float64(next-now) <= s.margin {
			// Close enough: spin to the due time instead of sleeping past it. Frames
			// arriving meanwhile are due after everything queued: no need to read them.
			s.spins++
			t := now
			for now < next {
				now = nowNs()
			}
			s.spinNs += now - t
			next = s.transmit(now)
		}
		ep := s.epIdle
		target = 0
		if next != 0 {
			target = next - int64(s.margin)
			ep = s.epBusy
		}
		if err := s.arm(target); err != nil {
			return err
		}
		n, err := unix.EpollWait(ep, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("epoll_wait: %w", err)
		}
		frames := false
		for _, ev := range events[:n] {
			switch int(ev.Fd) {
			case s.stopfd:
				return nil
			case s.tfd:
				var b [8]byte
				_, _ = unix.Read(s.tfd, b[:])
				s.armed = -1
				timerWoke = true
			default:
				frames = true
			}
		}
		if timerWoke {
			s.wakeTimer++
		} else if frames {
			s.wakeFrames++
		}
	}
}

// arm sets the timerfd to the absolute time at (0: disarm).
func (s *sw) arm(at int64) error {
	if at == s.armed {
		return nil
	}
	var its unix.ItimerSpec
	if at != 0 {
		its.Value = unix.NsecToTimespec(at)
	}
	if err := unix.TimerfdSettime(s.tfd, unix.TFD_TIMER_ABSTIME, &its, nil); err != nil {
		return fmt.Errorf("timerfd_settime: %w", err)
	}
	s.armed = at
	return nil
}

// transmit sends every frame due by now; it returns the earliest due time still queued
// (0 when nothing is).
func (s *sw) transmit(now int64) int64 {
	var next int64
	later := func(t int64) {
		if next == 0 || t < next {
			next = t
		}
	}
	for _, p := range s.ports {
		for p.q.len() > 0 {
			f := p.q.front()
			if f.due > now {
				later(f.due)
				break
			}
			t := nowNs()
			_, err := unix.Write(p.fd, f.buf)
			s.writeNs += nowNs() - t
			if err == unix.EAGAIN {
				later(now + retryNs)
				break
			}
			fr := p.q.pop()
			if err != nil {
				p.dropSend++
				p.lastSendErr = err
			} else {
				p.txFrames++
				p.txBytes += uint64(len(fr.buf) - vnetHdrLen)
				s.late.add(t - fr.due)
			}
			s.recycle(fr.buf)
		}
	}
	return next
}

// drainAll reads every frame waiting on any port and queues it on its output port.
func (s *sw) drainAll() {
	for _, p := range s.ports {
		for range readBatch {
			n, ts, ok := s.recv(p)
			if !ok {
				break
			}
			s.forward(p, n, ts)
		}
	}
}

// recv reads one frame into s.scratch: its length with the virtio-net header (0: none
// to forward), and its kernel receive timestamp. ok is false when nothing is waiting.
func (s *sw) recv(p *port) (n int, ts int64, ok bool) {
	s.iov.Base = &s.scratch[0]
	s.iov.SetLen(len(s.scratch))
	s.msg = unix.Msghdr{
		Name:    (*byte)(unsafe.Pointer(&s.sa)),
		Namelen: unix.SizeofSockaddrLinklayer,
		Iov:     &s.iov,
		Iovlen:  1,
		Control: &s.oob[0],
	}
	s.msg.SetControllen(len(s.oob))
	t := nowNs()
	r, _, errno := unix.Syscall(unix.SYS_RECVMSG, uintptr(p.fd), uintptr(unsafe.Pointer(&s.msg)), unix.MSG_TRUNC)
	now := nowNs()
	s.recvNs += now - t
	if errno != 0 {
		return 0, 0, false
	}
	n = int(r)
	ts = now
	if k := cmsgTimestamp(s.oob[:s.msg.Controllen]); k > 0 && k <= now && now-k < int64(time.Second) {
		ts = k
	}
	if s.sa.Pkttype == unix.PACKET_OUTGOING {
		return 0, 0, true
	}
	if n > len(s.scratch) || s.msg.Flags&unix.MSG_TRUNC != 0 {
		s.truncated++
		return 0, 0, true
	}
	p.rxFrames++
	p.rxBytes += uint64(n - vnetHdrLen)
	return n, ts, true
}

// cmsgTimestamp is the SCM_TIMESTAMPNS of a control message buffer (0 if none).
func cmsgTimestamp(b []byte) int64 {
	for len(b) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		if h.Len < unix.SizeofCmsghdr || h.Len > uint64(len(b)) {
			return 0
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS &&
			int(h.Len) >= unix.CmsgLen(int(unsafe.Sizeof(unix.Timespec{}))) {
			t := (*unix.Timespec)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
			return t.Nano()
		}
		b = b[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(b)):]
	}
	return 0
}

// forward queues the frame in s.scratch[:n] (n 0: nothing) on its output port, or on
// every other port when it is flooded.
func (s *sw) forward(in *port, n int, ts int64) {
	if n == 0 {
		return
	}
	if n < vnetHdrLen+14 {
		s.runts++
		return
	}
	eth := s.scratch[vnetHdrLen:n]
	s.fdb.learn(eth[6:12], in.index)
	due := ts + s.cfg.delay.Nanoseconds()
	out := s.fdb.lookup(eth[0:6])
	if out == in.index {
		s.filtered++ // the destination is on the port it came from
		return
	}
	if out >= 0 {
		s.enqueue(s.ports[out], s.take(n), due)
		return
	}
	s.flooded++
	for _, p := range s.ports {
		if p != in {
			b := s.get(n)
			copy(b, s.scratch[:n])
			s.enqueue(p, b, due)
		}
	}
}

func (s *sw) enqueue(p *port, b []byte, due int64) {
	if p.q.len() >= s.cfg.queue {
		p.dropQueue++
		s.recycle(b)
		return
	}
	p.q.push(frame{buf: b, due: due})
}

// take moves s.scratch[:n] into a buffer of its own: small frames are copied, a large
// one keeps the receive buffer, which is replaced.
func (s *sw) take(n int) []byte {
	if n <= smallBuf {
		b := s.get(n)
		copy(b, s.scratch[:n])
		return b
	}
	b := s.scratch[:n]
	s.scratch = s.get(bigBuf)
	return b
}

// get is a pooled buffer of length n.
func (s *sw) get(n int) []byte {
	pool, size := &s.big, bigBuf
	if n <= smallBuf {
		pool, size = &s.small, smallBuf
	}
	if k := len(*pool); k > 0 {
		b := (*pool)[k-1]
		*pool = (*pool)[:k-1]
		return b[:n]
	}
	return make([]byte, n, size)
}

func (s *sw) recycle(b []byte) {
	switch cap(b) {
	case smallBuf:
		s.small = append(s.small, b[:0])
	case bigBuf:
		s.big = append(s.big, b[:0])
	}
}

// report prints the counters, the lateness of the sends and the CPU used.
func (s *sw) report(wall time.Duration, ru0 *unix.Rusage) {
	var rx, tx, rxB, txB, dq, ds, kdrop uint64
	var sendErr error
	for _, p := range s.ports {
		rx += p.rxFrames
		tx += p.txFrames
		rxB += p.rxBytes
		txB += p.txBytes
		dq += p.dropQueue
		ds += p.dropSend
		if p.lastSendErr != nil {
			sendErr = p.lastSendErr
		}
		if st, err := unix.GetsockoptTpacketStats(p.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			kdrop += uint64(st.Drops)
		}
	}
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	user := time.Duration(ru.Utime.Nano() - ru0.Utime.Nano())
	sys := time.Duration(ru.Stime.Nano() - ru0.Stime.Nano())
	fmt.Fprintf(os.Stderr, "delayswitch: frames in %d (%d B), out %d (%d B), flooded %d, filtered %d; dropped: queue %d, send %d, socket %d, truncated %d, runt %d\n",
		rx, rxB, tx, txB, s.flooded, s.filtered, dq, ds, kdrop, s.truncated, s.runts)
	if sendErr != nil {
		fmt.Fprintf(os.Stderr, "delayswitch: last send error: %v\n", sendErr)
	}
	fmt.Fprintf(os.Stderr, "delayswitch: lateness (sent - due): %s; %d stalls (ready > 2 ms after the timer)\n", &s.late, s.stalls)
	fmt.Fprintf(os.Stderr, "delayswitch: timer wake-up lag (ready - armed time): %s\n", &s.lag)
	fmt.Fprintf(os.Stderr, "delayswitch: wake-ups: %d for frames, %d by the timer, %d spins; early wake margin now %.1f us\n",
		s.wakeFrames, s.wakeTimer, s.spins, s.margin/1e3)
	pct := 0.0
	if wall > 0 {
		pct = 100 * float64(user+sys) / float64(wall)
	}
	fmt.Fprintf(os.Stderr, "delayswitch: cpu user %.2fs sys %.2fs = %.1f%% of one core over %.1fs (spinning %.2fs, in recvmsg %.2fs, in write %.2fs)\n",
		user.Seconds(), sys.Seconds(), pct, wall.Seconds(), float64(s.spinNs)/1e9, float64(s.recvNs)/1e9, float64(s.writeNs)/1e9)
}
