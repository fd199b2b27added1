package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// The hello is a four-message exchange on every new connection:
//
//	dialer   -> acceptor  hello{magic, version, group, epoch, ranks, stream, nonceD}
//	acceptor -> dialer    status; if OK: nonceA, MAC_A = HMAC(secret, "a2a-acc"|fields|nonceD|nonceA)
//	dialer   -> acceptor  MAC_D = HMAC(secret, "a2a-dial"|fields|nonceA|nonceD)
//	acceptor -> dialer    ack (one zero byte) once the connection fills its slot
//
// Each side proves knowledge of the secret over a nonce the other side chose,
// so a recorded exchange cannot be replayed. The status byte lets a real peer
// with a wrong epoch or group fail at once with a useful error instead of
// timing out; it tells a stranger nothing that is secret.
//
// Hello layout (little endian):
//
//	0 magic u32   4 version u8   5 reserved u8   6 group length u16
//	8 epoch u32  12 dialer rank u32  16 acceptor rank u32  20 stream u32
//	24 nonceD [32]byte  56 group name
const (
	helloMagic   uint32 = 0xA2A04E11
	helloVersion byte   = 1
	helloFixed          = 56
	nonceSize           = 32
	macSize             = sha256.Size
	replySize           = 1 + nonceSize + macSize

	labelAcc  = "a2a-acc"
	labelDial = "a2a-dial"
)

// Status codes an acceptor answers a well-formed hello with.
const (
	statusOK byte = iota
	statusBadGroup
	statusBadEpoch
	statusBadRank
	statusDuplicate
)

func statusText(s byte) string {
	switch s {
	case statusOK:
		return "ok"
	case statusBadGroup:
		return "different group"
	case statusBadEpoch:
		return "different epoch"
	case statusBadRank:
		return "ranks or stream outside the job"
	case statusDuplicate:
		return "connection slot already taken"
	}
	return fmt.Sprintf("status %d", s)
}

type hello struct {
	group    string
	epoch    uint32
	dialer   uint32
	acceptor uint32
	stream   uint32
	nonce    [nonceSize]byte // the dialer's nonce
}

func (h *hello) marshal() []byte {
	b := make([]byte, helloFixed+len(h.group))
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	binary.LittleEndian.PutUint16(b[6:], uint16(len(h.group)))
	binary.LittleEndian.PutUint32(b[8:], h.epoch)
	binary.LittleEndian.PutUint32(b[12:], h.dialer)
	binary.LittleEndian.PutUint32(b[16:], h.acceptor)
	binary.LittleEndian.PutUint32(b[20:], h.stream)
	copy(b[24:], h.nonce[:])
	copy(b[helloFixed:], h.group)
	return b
}

// unmarshalFixed decodes the fixed part and returns the group name's length,
// or an error when b is not an a2a hello.
func (h *hello) unmarshalFixed(b []byte) (int, error) {
	if m := binary.LittleEndian.Uint32(b[0:]); m != helloMagic {
		return 0, fmt.Errorf("bad hello magic %#x", m)
	}
	if b[4] != helloVersion {
		return 0, fmt.Errorf("hello version %d, want %d", b[4], helloVersion)
	}
	n := int(binary.LittleEndian.Uint16(b[6:]))
	if n > maxGroupLen {
		return 0, fmt.Errorf("group name of %d bytes", n)
	}
	h.epoch = binary.LittleEndian.Uint32(b[8:])
	h.dialer = binary.LittleEndian.Uint32(b[12:])
	h.acceptor = binary.LittleEndian.Uint32(b[16:])
	h.stream = binary.LittleEndian.Uint32(b[20:])
	copy(h.nonce[:], b[24:helloFixed])
	return n, nil
}

// mac is HMAC-SHA256(secret, label|fields|first|second). The group travels
// length-prefixed so no two field lists encode to the same bytes.
func (h *hello) mac(secret []byte, label string, first, second *[nonceSize]byte) [macSize]byte {
	m := hmac.New(sha256.New, secret)
	var f [18]byte
	binary.LittleEndian.PutUint16(f[0:], uint16(len(h.group)))
	m.Write([]byte(label))
	m.Write(f[:2])
	m.Write([]byte(h.group))
	binary.LittleEndian.PutUint32(f[2:], h.epoch)
	binary.LittleEndian.PutUint32(f[6:], h.dialer)
	binary.LittleEndian.PutUint32(f[10:], h.acceptor)
	binary.LittleEndian.PutUint32(f[14:], h.stream)
	m.Write(f[2:])
	m.Write(first[:])
	m.Write(second[:])
	var sum [macSize]byte
	m.Sum(sum[:0])
	return sum
}

// readHello reads and decodes a dialer's hello from c.
func readHello(c net.Conn) (hello, error) {
	var h hello
	var fixed [helloFixed]byte
	if _, err := io.ReadFull(c, fixed[:]); err != nil {
		return h, fmt.Errorf("reading hello: %w", err)
	}
	n, err := h.unmarshalFixed(fixed[:])
	if err != nil {
		return h, err
	}
	g := make([]byte, n)
	if _, err := io.ReadFull(c, g); err != nil {
		return h, fmt.Errorf("reading hello: %w", err)
	}
	h.group = string(g)
	return h, nil
}

// acceptAuth runs the acceptor's half of the authentication after h passed
// the slot checks: it sends nonceA and MAC_A, and verifies the dialer's MAC_D.
func acceptAuth(c net.Conn, secret []byte, h *hello) error {
	var nonceA [nonceSize]byte
	if _, err := rand.Read(nonceA[:]); err != nil {
		return err
	}
	macA := h.mac(secret, labelAcc, &h.nonce, &nonceA)
	var reply [replySize]byte
	reply[0] = statusOK
	copy(reply[1:], nonceA[:])
	copy(reply[1+nonceSize:], macA[:])
	if _, err := c.Write(reply[:]); err != nil {
		return fmt.Errorf("sending nonce: %w", err)
	}
	var macD [macSize]byte
	if _, err := io.ReadFull(c, macD[:]); err != nil {
		return fmt.Errorf("reading MAC: %w", err)
	}
	want := h.mac(secret, labelDial, &nonceA, &h.nonce)
	if !hmac.Equal(macD[:], want[:]) {
		return fmt.Errorf("dialer failed authentication")
	}
	return nil
}

// dialHello runs the dialer's side of the hello on c. A permanent failure
// means the peer answered and refused us, or could not prove it knows the
// secret; retrying cannot help.
func dialHello(c net.Conn, secret []byte, h *hello) (permanent bool, err error) {
	if _, err := rand.Read(h.nonce[:]); err != nil {
		return true, err
	}
	if _, err := c.Write(h.marshal()); err != nil {
		return false, fmt.Errorf("sending hello: %w", err)
	}
	var reply [replySize]byte
	if _, err := io.ReadFull(c, reply[:1]); err != nil {
		return false, fmt.Errorf("waiting for the hello reply: %w", err)
	}
	if reply[0] != statusOK {
		return true, fmt.Errorf("hello refused: %s", statusText(reply[0]))
	}
	if _, err := io.ReadFull(c, reply[1:]); err != nil {
		return false, fmt.Errorf("reading the hello reply: %w", err)
	}
	var nonceA [nonceSize]byte
	copy(nonceA[:], reply[1:])
	want := h.mac(secret, labelAcc, &h.nonce, &nonceA)
	if !hmac.Equal(reply[1+nonceSize:], want[:]) {
		return true, fmt.Errorf("peer failed authentication (different group secret?)")
	}
	macD := h.mac(secret, labelDial, &nonceA, &h.nonce)
	if _, err := c.Write(macD[:]); err != nil {
		return false, fmt.Errorf("sending MAC: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return false, fmt.Errorf("waiting for the hello ack: %w", err)
	}
	if ack[0] != statusOK {
		return true, fmt.Errorf("connection refused after authentication: %s", statusText(ack[0]))
	}
	return false, nil
}
