package tcp

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// rawConn is a conn on one end of a socket pair, the other end returned for
// the test to write and read raw bytes.
func rawConn(t testing.TB) (*conn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return testConn(t, fds)
}

// testConn is a conn on fds[0], closed with fds[1] when the test ends; it
// returns fds[1] for the test to write and read raw bytes.
func testConn(t testing.TB, fds [2]int) (*conn, int) {
	var sent, recvd atomic.Uint64
	c := &conn{fd: fds[0], peer: 1, sent: &sent, recvd: &recvd, closedErr: fault.New(fault.ErrClosed, 1, "closed")}
	t.Cleanup(func() {
		c.close()
		unix.Close(fds[1])
	})
	return c, fds[1]
}

// encodeFrame is a frame of h with payload as it goes on the wire.
func encodeFrame(h transport.Header, payload []byte) []byte {
	b := make([]byte, hdrSize, hdrSize+len(payload))
	h.Len = uint64(len(payload))
	h.Encode(b)
	return append(b, payload...)
}

// TestSmallRecvTrickle feeds two small frames back to back one byte at a
// time: the staged receive completes the first only with its last byte,
// takes nothing of the second, and lands each payload whole, at the sizes
// around the staging buffer's limit (the largest staged one, the smallest
// that is not, a header alone).
func TestSmallRecvTrickle(t *testing.T) {
	for _, size := range []int{0, 8, smallMax, smallMax + 1} {
		c, peer := rawConn(t)
		var wire []byte
		payloads := [2][]byte{pattern(uint64(size), size), pattern(uint64(size+1), size)}
		for i, p := range payloads {
			h := fuzzWant
			h.Seq = uint64(i)
			wire = append(wire, encodeFrame(h, p)...)
		}
		var op transport.RecvOp
		for i, want := range payloads {
			h := fuzzWant
			h.Seq = uint64(i)
			op.Reset(h, make([]byte, size), false)
			for k := 0; ; k++ {
				done, err := c.TryRecv(&op)
				if err != nil {
					t.Fatalf("size %d frame %d: %v", size, i, err)
				}
				if done {
					if k != hdrSize+size {
						t.Fatalf("size %d frame %d: done after %d bytes, want %d", size, i, k, hdrSize+size)
					}
					break
				}
				if k == hdrSize+size {
					t.Fatalf("size %d frame %d: not done with all its bytes in", size, i)
				}
				if _, err := unix.Write(peer, wire[:1]); err != nil {
					t.Fatal(err)
				}
				wire = wire[1:]
			}
			if op.N != size || !bytes.Equal(op.Dst, want) || op.Got.Seq != uint64(i) {
				t.Fatalf("size %d frame %d: landed %d bytes (seq %d), want %d, equal %v", size, i, op.N, op.Got.Seq, size, bytes.Equal(op.Dst, want))
			}
		}
	}
}

// TestSmallRecvMismatch: a staged receive checks the header as soon as it
// is in, before the payload.
func TestSmallRecvMismatch(t *testing.T) {
	c, peer := rawConn(t)
	h := fuzzWant
	h.Seq++
	if _, err := unix.Write(peer, encodeFrame(h, make([]byte, 16))[:hdrSize]); err != nil {
		t.Fatal(err)
	}
	var op transport.RecvOp
	op.Reset(fuzzWant, make([]byte, 16), false)
	if _, err := c.TryRecv(&op); !errors.Is(err, fault.ErrMismatch) {
		t.Fatalf("TryRecv: %v, want ErrMismatch", err)
	}
}

// tcpPair is a conn on one end of a loopback TCP connection with a small
// send buffer, and the descriptor of the other end (non-blocking).
func tcpPair(t *testing.T) (*conn, int) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := ln.AcceptTCP()
	if err != nil {
		dialed.Close()
		t.Fatal(err)
	}
	// A small send buffer, so that a frame finds room for part of it once
	// the peer's window is full.
	dialed.SetWriteBuffer(4096)
	fds := [2]int{-1, -1}
	for i, tc := range []*net.TCPConn{dialed, accepted} {
		if fds[i], err = detach(tc); err != nil {
			t.Fatal(err)
		}
	}
	return testConn(t, fds)
}

// TestSmallSendBlocked sends small frames through a small send buffer,
// reading the other end only when the sender is blocked, until a frame has
// gone out in pieces: the stream is the frames in order, whole.
func TestSmallSendBlocked(t *testing.T) {
	c, peer := tcpPair(t)
	const size = 1000 // frames of 1048 bytes do not divide the socket buffers
	var want, got []byte
	buf := make([]byte, 1500)
	read := func() {
		n, err := unix.Read(peer, buf)
		if err != nil && err != unix.EAGAIN {
			t.Fatal(err)
		}
		got = append(got, buf[:max(n, 0)]...)
	}
	partial := 0
	var op transport.SendOp
	for i := 0; i < 2000 && partial == 0; i++ {
		p := pattern(uint64(i), size)
		h := fuzzWant
		h.Seq = uint64(i)
		op.Reset(h, p)
		want = append(want, encodeFrame(h, p)...)
		for {
			done, err := c.TrySend(&op)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				break
			}
			if op.Progress > 0 {
				partial++
			}
			read()
		}
	}
	if partial == 0 {
		t.Fatal("no frame went out in pieces")
	}
	for deadline := time.Now().Add(10 * time.Second); len(got) < len(want) && time.Now().Before(deadline); {
		read()
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the stream (%d bytes) differs from the frames sent (%d bytes)", len(got), len(want))
	}
}
