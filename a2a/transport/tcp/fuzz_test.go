package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// fuzzWant is the frame the receiving side of FuzzRecv expects: rank 1's
// 16-byte AllToAllV block of op 42.
var fuzzWant = transport.Header{Kind: transport.OpAllToAllV, Algo: 2, Flags: transport.FlagLast, Epoch: testEpoch, Src: 1, Seq: 42, Len: 16}

// FuzzRecv writes arbitrary bytes into a real socket as the peer's side of a
// stream and receives them with the TCP conn. Nothing may panic or hang; the
// receive either completes with exactly the payload that followed the header,
// or fails with ErrMismatch (a header it did not expect) or ErrPeerLost (the
// peer closed the stream early).
func FuzzRecv(f *testing.F) {
	frame := func(h transport.Header, payload []byte) []byte {
		b := make([]byte, transport.HeaderSize, transport.HeaderSize+len(payload))
		h.Len = uint64(len(payload))
		h.Encode(b)
		return append(b, payload...)
	}
	payload := bytes.Repeat([]byte{0xa5}, 16)
	f.Add(frame(fuzzWant, payload), false, uint8(0))
	f.Add(frame(fuzzWant, payload[:8]), true, uint8(0))
	put := fuzzWant
	put.Kind, put.Aux = transport.OpPut, 8
	f.Add(frame(put, payload[:8]), false, uint8(16))
	put.Aux = 1<<64 - 4
	f.Add(frame(put, payload[:8]), false, uint8(16))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), false, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, anyLen bool, window uint8) {
		if len(data) > 64<<10 { // stays within one socket buffer
			return
		}
		c, other := rawConn(t)
		if len(data) > 0 {
			if n, err := unix.Write(other, data); err != nil || n != len(data) {
				t.Fatalf("writing %d bytes: %d, %v", len(data), n, err)
			}
		}
		unix.Shutdown(other, unix.SHUT_WR) // the peer goes away after its bytes

		var op transport.RecvOp
		op.Reset(fuzzWant, make([]byte, fuzzWant.Len), anyLen)
		if window > 0 {
			op.Want.Kind = transport.OpPut
			op.Window = make([]byte, window)
		}
		for i := 0; ; i++ {
			done, err := c.TryRecv(&op)
			if err != nil {
				if !errors.Is(err, fault.ErrMismatch) && !errors.Is(err, fault.ErrPeerLost) {
					t.Fatalf("TryRecv: %v, want ErrMismatch or ErrPeerLost", err)
				}
				return
			}
			if done {
				break
			}
			if i > len(data)+8 {
				t.Fatalf("TryRecv makes no progress on %d bytes and then EOF", len(data))
			}
		}
		n := op.N
		if uint64(n) != op.Got.Len || transport.HeaderSize+n > len(data) {
			t.Fatalf("received %d bytes for a header of %d, from %d bytes", n, op.Got.Len, len(data))
		}
		var got []byte
		if op.Window != nil {
			got = op.Window[op.Got.Aux : op.Got.Aux+op.Got.Len]
		} else {
			got = op.Dst[:n]
		}
		if !bytes.Equal(got, data[transport.HeaderSize:transport.HeaderSize+n]) {
			t.Fatalf("payload %x, sent %x", got, data[transport.HeaderSize:transport.HeaderSize+n])
		}
	})
}

// FuzzHello plays a stranger dialing the data port: arbitrary bytes go to the
// acceptor's side of the hello (readHello, the slot check, acceptAuth).
// Nothing may panic, and no input authenticates: without the secret no one
// can answer the acceptor's fresh nonce.
func FuzzHello(f *testing.F) {
	l := &Listener{cfg: testConfig(f, 0, 4, 2), state: stateConnecting, epoch: testEpoch,
		slots: make([]*net.TCPConn, 3*2), linked: []bool{false, true, true, true}}
	h := hello{group: l.cfg.Group, epoch: testEpoch, dialer: 2, acceptor: 0, stream: 1}
	good := h.marshal()
	f.Add(append(bytes.Clone(good), make([]byte, macSize)...))
	bad := bytes.Clone(good)
	bad[6], bad[7] = 0xff, 0xff // a group name longer than any allowed
	f.Add(bad)
	f.Add(good[:helloFixed-1])
	f.Add([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		server, client := socketPair(t)
		defer server.Close()
		var wg sync.WaitGroup
		defer wg.Wait()
		defer client.Close()
		wg.Go(func() {
			client.Write(data)
			client.CloseWrite() // the stranger says no more
			io.Copy(io.Discard, client)
		})
		server.SetDeadline(time.Now().Add(5 * time.Second))

		got, err := readHello(server)
		if err != nil {
			return
		}
		if len(got.group) > maxGroupLen {
			t.Fatalf("hello with a %d-byte group accepted", len(got.group))
		}
		slot, status := l.check(&got)
		if status != statusOK {
			return
		}
		if slot < 0 || slot >= len(l.slots) {
			t.Fatalf("hello %+v claims slot %d of %d", got, slot, len(l.slots))
		}
		if err := acceptAuth(server, l.cfg.Secret, &got); err == nil {
			t.Fatalf("a stranger's hello authenticated: %x", data)
		}
	})
}

// socketPair returns the two ends of a connected stream socket pair.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = c.(*net.UnixConn)
	}
	return ends[0], ends[1]
}
