package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// addrVersion changes whenever the address layout or the wire protocol does:
// ranks of different versions never connect.
const addrVersion = 1

// geometry is what both ends of a pair must agree on: the sizes of the
// receive rings and LL slots each addresses in the other's memory.
type geometry struct {
	Size       int // world size: the rings and QPs are indexed by rank
	Streams    int
	ChunkBytes int // one ring slot
	RingSlots  int // slots per stream
	SlotBytes  int // LL payload per slot; 0: no LL window
}

// remoteEndpoint is one device port a rank announced.
type remoteEndpoint struct {
	LinkLayer ibv.LinkLayer
	MTU       ibv.MTU
	LID       uint16
	GID       ibv.GID
	PSN       uint32
	RingAddr  uint64 // base of its receive rings: one per (source rank, stream)
	RingKey   uint32
	WinAddr   uint64 // base of its LL window: per source rank two slots
	WinKey    uint32
	QPN       []uint32 // by peer*Streams+stream: the QP that talks to that peer
}

// address is a rank's announcement: its geometry and every device port it
// can use, with a QP for each (peer, stream) on each.
type address struct {
	geometry
	Endpoints []remoteEndpoint
}

const (
	addrHeader   = 1 + 1 + 2 + 4 + 4 + 2 + 4
	addrEndpoint = 1 + 1 + 2 + 16 + 4 + 8 + 4 + 8 + 4
)

func (a *address) encode() []byte {
	n := a.Size * a.Streams
	b := make([]byte, 0, addrHeader+len(a.Endpoints)*(addrEndpoint+4*n))
	b = append(b, addrVersion, byte(len(a.Endpoints)))
	b = binary.LittleEndian.AppendUint16(b, uint16(a.Streams))
	b = binary.LittleEndian.AppendUint32(b, uint32(a.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(a.ChunkBytes))
	b = binary.LittleEndian.AppendUint16(b, uint16(a.RingSlots))
	b = binary.LittleEndian.AppendUint32(b, uint32(a.SlotBytes))
	for _, e := range a.Endpoints {
		b = append(b, byte(e.LinkLayer), byte(e.MTU))
		b = binary.LittleEndian.AppendUint16(b, e.LID)
		b = append(b, e.GID[:]...)
		b = binary.LittleEndian.AppendUint32(b, e.PSN)
		b = binary.LittleEndian.AppendUint64(b, e.RingAddr)
		b = binary.LittleEndian.AppendUint32(b, e.RingKey)
		b = binary.LittleEndian.AppendUint64(b, e.WinAddr)
		b = binary.LittleEndian.AppendUint32(b, e.WinKey)
		for _, q := range e.QPN {
			b = binary.LittleEndian.AppendUint32(b, q)
		}
	}
	return b
}

// decodeAddress parses what rank announced; anything malformed or of another
// version is ErrMismatch naming it.
func decodeAddress(rank int, b []byte) (*address, error) {
	bad := func(format string, args ...any) error {
		return fault.New(fault.ErrMismatch, rank, "verbs: rank %d's address: %s", rank, fmt.Sprintf(format, args...))
	}
	if len(b) < addrHeader {
		return nil, bad("%d bytes, too short", len(b))
	}
	if b[0] != addrVersion {
		return nil, bad("version %d, this rank speaks %d", b[0], addrVersion)
	}
	a := &address{geometry: geometry{
		Streams:    int(binary.LittleEndian.Uint16(b[2:])),
		Size:       int(binary.LittleEndian.Uint32(b[4:])),
		ChunkBytes: int(binary.LittleEndian.Uint32(b[8:])),
		RingSlots:  int(binary.LittleEndian.Uint16(b[12:])),
		SlotBytes:  int(binary.LittleEndian.Uint32(b[14:])),
	}}
	neps, n := int(b[1]), a.Size*a.Streams
	if neps == 0 || a.Streams == 0 || a.Size == 0 {
		return nil, bad("%d endpoints, %d ranks, %d streams", neps, a.Size, a.Streams)
	}
	if want := addrHeader + neps*(addrEndpoint+4*n); len(b) != want {
		return nil, bad("%d bytes, want %d", len(b), want)
	}
	p := b[addrHeader:]
	for range neps {
		e := remoteEndpoint{LinkLayer: ibv.LinkLayer(p[0]), MTU: ibv.MTU(p[1]), LID: binary.LittleEndian.Uint16(p[2:])}
		copy(e.GID[:], p[4:20])
		e.PSN = binary.LittleEndian.Uint32(p[20:])
		e.RingAddr = binary.LittleEndian.Uint64(p[24:])
		e.RingKey = binary.LittleEndian.Uint32(p[32:])
		e.WinAddr = binary.LittleEndian.Uint64(p[36:])
		e.WinKey = binary.LittleEndian.Uint32(p[44:])
		p = p[addrEndpoint:]
		e.QPN = make([]uint32, n)
		for i := range e.QPN {
			e.QPN[i] = binary.LittleEndian.Uint32(p[4*i:])
		}
		p = p[4*n:]
		if e.MTU.Bytes() == 0 {
			return nil, bad("MTU code %d", e.MTU)
		}
		a.Endpoints = append(a.Endpoints, e)
	}
	return a, nil
}
