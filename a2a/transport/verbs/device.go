package verbs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	ibv "github.com/a2a-moe/a2a/verbs"
)

// region is an anonymous mapping registered with a device: memory the Go
// runtime never owns, so the registration stays valid until it is closed.
type region struct {
	mem []byte
	mr  *ibv.MR
}

func newRegion(pd *ibv.PD, n int, access ibv.Access) (region, error) {
	n = (n + 4095) &^ 4095
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return region{}, fmt.Errorf("verbs: mapping %d bytes: %w", n, err)
	}
	mr, err := pd.RegMR(mem, access)
	if err != nil {
		unix.Munmap(mem)
		return region{}, err
	}
	return region{mem: mem, mr: mr}, nil
}

func (r *region) close() error {
	var errs []error
	if r.mr != nil {
		errs = append(errs, r.mr.Close())
		r.mr = nil
	}
	if r.mem != nil {
		errs = append(errs, unix.Munmap(r.mem))
		r.mem = nil
	}
	return errors.Join(errs...)
}

// The queue depths of every QP, from the ring geometry: a peer has at most
// RingSlots data chunks unconsumed in this rank's ring (its credits), at
// most as many credit returns outstanding (one per chunk it took), and a
// few control messages (hello, goodbye, LL stores: at most two per pair are
// ever unread, one per epoch parity). Receives are reposted as completions
// are polled, so a peer never finds none posted.
func sqDepth(ringSlots int) int { return 2*ringSlots + 16 }
func rqDepth(ringSlots int) int { return 2*ringSlots + 24 }

// repostBatch is how many consumed receives are reposted at once.
const repostBatch = 8

// maxInline is the inline data a QP is asked for: a frame of up to this many
// bytes (header included) is copied into the work request when it is
// posted, so it needs no bounce buffer and no completion before its memory
// is reused.
const maxInline = 256

// device is one port's verbs objects as Listen prepares them: QPs in INIT
// with receives posted for every (rank, stream), the receive rings and the
// LL window registered, the send staging (bounce pool, control words, LL
// staging) registered.
type device struct {
	ep     ibv.Endpoint
	ctx    *ibv.Context
	pd     *ibv.PD
	ch     *ibv.CompChannel
	cq     *ibv.CQ
	qps    []*ibv.QP // by rank*Streams+stream; nil once destroyed
	psn    uint32
	inline int // inline bytes every QP was granted

	rings  region // receive rings: Size*Streams*RingSlots chunks
	window region // LL window: Size*2 slots; empty without LL
	bounce region // bounce pool: bounceBufs chunks
	ctl    region // per (rank, stream) ctlBytes: zero-copy header, hello MAC; then LL staging
}

// ctlBytes is the per-conn control area: the header of a zero-copy frame
// (48 bytes) and the hello's MAC.
const (
	ctlBytes  = 128
	ctlHeader = 0
	ctlHello  = 64
)

func bounceBufs(ringSlots int) int { return max(16, 4*ringSlots) }

// llStride is the bytes of one LL slot: the length word and the data words
// (4 payload bytes each), cache-line aligned.
func llStride(slotBytes int) int {
	return (8*(1+transport.SlotWords(slotBytes)) + 63) &^ 63
}

// openDevice prepares ep for a group of geometry g.
func openDevice(lib *ibv.Lib, ep ibv.Endpoint, g geometry) (d *device, err error) {
	d = &device{ep: ep, psn: ibv.RandomPSN()}
	defer func() {
		if err != nil {
			d.close()
			d = nil
		}
	}()
	if d.ctx, err = lib.Open(ep.Device); err != nil {
		return
	}
	if d.pd, err = d.ctx.AllocPD(); err != nil {
		return
	}
	if d.ch, err = d.ctx.NewCompChannel(); err != nil {
		return
	}
	nqp := g.Size * g.Streams
	sq, rq := sqDepth(g.RingSlots), rqDepth(g.RingSlots)
	if d.cq, err = d.ctx.NewCQ(nqp*(sq+rq), d.ch); err != nil {
		return
	}
	local := ibv.AccessLocalWrite
	remote := ibv.AccessLocalWrite | ibv.AccessRemoteWrite
	if d.rings, err = newRegion(d.pd, nqp*g.RingSlots*g.ChunkBytes, remote); err != nil {
		return
	}
	if g.SlotBytes > 0 {
		if d.window, err = newRegion(d.pd, g.Size*2*llStride(g.SlotBytes), remote); err != nil {
			return
		}
	}
	if d.bounce, err = newRegion(d.pd, bounceBufs(g.RingSlots)*g.ChunkBytes, local); err != nil {
		return
	}
	ctl := nqp * ctlBytes
	if g.SlotBytes > 0 {
		ctl += g.Size * 2 * llStride(g.SlotBytes)
	}
	if d.ctl, err = newRegion(d.pd, ctl, local); err != nil {
		return
	}
	d.qps = make([]*ibv.QP, nqp)
	ids := make([]uint64, rq)
	sges := make([]ibv.SGE, rq)
	d.inline = maxInline
	for i := range d.qps {
		caps := ibv.QPCaps{MaxSendWR: sq, MaxRecvWR: rq, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInline: maxInline}
		qp, err := d.pd.NewRCQP(ibv.QPConfig{SendCQ: d.cq, RecvCQ: d.cq, Caps: caps})
		if err != nil {
			return nil, err
		}
		d.qps[i] = qp
		d.inline = min(d.inline, qp.Caps().MaxInline)
		if err := qp.Init(ep, connectOptions); err != nil {
			return nil, err
		}
		// Receives carry no data (every message is an RDMA WRITE WITH
		// IMM that lands where the sender says): an empty SGE each.
		for k := range ids {
			ids[k] = wrID(i, wrRecv, 0)
			sges[k] = d.rings.mr.SGE(0, 0)
		}
		if err := qp.PostRecvs(ids, sges); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// connectOptions are the QPs' connection settings. The ACK timeout (15:
// 4.096 us * 2^15 = 134 ms) times 8 tries lets a peer take about 1 s longer
// than this rank to bring its QPs up after the rendezvous (a first packet it
// dropped is retried meanwhile) and declares a dead peer's QP in error
// within about 1 s. The retry count is 6, not the verbs maximum 7, which
// Soft-RoCE takes for "retry forever" (as the spec does only for RNR). RNR retry 7 is "forever": a receive is always
// posted by design, and a late repost must not kill the connection.
var connectOptions = ibv.ConnectOptions{Timeout: 15, RetryCount: 6, RNRRetry: 7,
	Access: ibv.AccessLocalWrite | ibv.AccessRemoteWrite}

// dropQPs destroys the QPs for which keep is false.
func (d *device) dropQPs(keep func(i int) bool) error {
	var errs []error
	for i, qp := range d.qps {
		if qp != nil && !keep(i) {
			errs = append(errs, qp.Close())
			d.qps[i] = nil
		}
	}
	return errors.Join(errs...)
}

// close destroys everything in reverse order of creation.
func (d *device) close() error {
	if d == nil {
		return nil
	}
	errs := []error{d.dropQPs(func(int) bool { return false })}
	for _, r := range []*region{&d.ctl, &d.bounce, &d.window, &d.rings} {
		errs = append(errs, r.close())
	}
	if d.cq != nil {
		// Events still unread on the channel were acknowledged as they were
		// read, so the CQ goes without waiting.
		errs = append(errs, d.cq.Close())
		d.cq = nil
	}
	if d.ch != nil {
		errs = append(errs, d.ch.Close())
		d.ch = nil
	}
	if d.pd != nil {
		errs = append(errs, d.pd.Close())
		d.pd = nil
	}
	if d.ctx != nil {
		errs = append(errs, d.ctx.Close())
		d.ctx = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fault.Wrap(fault.ErrClosed, -1, err, "verbs: releasing %s", d.ep.Device)
	}
	return nil
}

// memlockNeed is the memory openDevice registers for geometry g on one
// device.
func memlockNeed(g geometry) uint64 {
	nqp := g.Size * g.Streams
	n := nqp*g.RingSlots*g.ChunkBytes + bounceBufs(g.RingSlots)*g.ChunkBytes + nqp*ctlBytes
	if g.SlotBytes > 0 {
		n += 2 * g.Size * 2 * llStride(g.SlotBytes)
	}
	return uint64(n)
}
