package transport

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Demux lets several communicators share one Transport (a2a's Comm.Split
// and Comm.Dup): no new connections, segments or queue pairs. Their frames
// travel on the same Conns, told apart by Header.Comm (0 for the
// communicator that joined, the root). Each communicator numbers its own
// operations, so the Conns' order only holds per communicator.
//
// Until a second communicator opens (Open), Conn hands out the
// transport's own Conns: the root pays nothing for the sharing it does not
// use. From then on every Conn goes through a lock and the demultiplexer,
// from any number of goroutines (one driver per communicator):
//   - sends: one frame at a time per Conn and direction, as before; a
//     communicator's send waits while another's frame goes out.
//   - receives: whichever communicator polls a Conn reads the next frame. A
//     frame of the poller lands straight in its receive; a frame of another
//     communicator lands in a buffer of its own (the stash, one copy more),
//     its communicator is woken, and its next receive takes it from there.
//     So no communicator waits on another one's frames.
//
// LL slots (Slots) stay the root's: views offer none, so a child runs its
// small messages through frames.
type Demux struct {
	tr      Transport
	rank    int
	streams int
	on      atomic.Bool
	conns   []*demuxConn // by peer*streams+stream; nil for this rank
	root    []viewConn   // the root's view of conns
	mu      sync.Mutex   // guards next, views and dead
	next    uint16       // the least communicator id this rank has not used
	views   map[uint16]*View
	dead    sync.Map // communicator ids closed: their late frames are dropped
}

// NewDemux readies tr, which connects rank with size ranks, for sharing.
func NewDemux(tr Transport, rank, size int) *Demux {
	d := &Demux{tr: tr, rank: rank, streams: tr.Streams(), next: 1, views: map[uint16]*View{}}
	d.conns = make([]*demuxConn, size*d.streams)
	d.root = make([]viewConn, size*d.streams)
	for p := range size {
		if p == rank {
			continue
		}
		for s := range d.streams {
			i := p*d.streams + s
			dc := &demuxConn{d: d, under: tr.Conn(p, s), peer: p}
			dc.rop.Route, dc.rop.AnyLen = dc.route, true
			d.conns[i] = dc
			d.root[i] = viewConn{dc: dc}
		}
	}
	return d
}

// Conn is the root's stream-th stream to peer: the transport's own Conn
// until the transport is shared.
func (d *Demux) Conn(peer, stream int) Conn {
	i := peer*d.streams + stream
	if !d.on.Load() {
		return d.conns[i].under
	}
	return &d.root[i]
}

// Shared reports whether a communicator other than the root opened.
func (d *Demux) Shared() bool { return d.on.Load() }

// Next is the least communicator id this rank has not used. Ranks that
// create communicators together agree on ids above every member's Next, so
// that no rank reuses one (Reserve).
func (d *Demux) Next() uint16 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.next
}

// Reserve marks the ids below next as used on this rank.
func (d *Demux) Reserve(next uint16) {
	d.mu.Lock()
	d.next = max(d.next, next)
	d.mu.Unlock()
}

// Sharer is implemented by transports that look at a Conn's state outside
// the Conn's own calls (shm: an LL load checks stream 0 for a frame, which
// means the peer runs another operation). ShareConns tells them that from now
// on other goroutines drive the Conns and frames of other communicators may
// come at any time, so such checks must stop.
type Sharer interface {
	ShareConns()
}

// Open opens the view of communicator comm (not 0, not used before on this
// rank), whose rank i is the transport's rank ranks[i], and turns sharing on.
func (d *Demux) Open(comm uint16, ranks []int) (*View, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if comm == 0 || comm < d.next || d.views[comm] != nil || d.isDead(comm) {
		return nil, fault.New(fault.ErrInvalidArgument, d.rank, "communicator id %d is used already on this rank", comm)
	}
	v := &View{d: d, comm: comm, ranks: ranks, wake: make(chan struct{}, 1)}
	v.conns = make([]viewConn, len(ranks)*d.streams)
	for i, r := range ranks {
		if r == d.rank {
			continue
		}
		for s := range d.streams {
			v.conns[i*d.streams+s] = viewConn{dc: d.conns[r*d.streams+s], comm: comm}
		}
	}
	d.next = comm + 1 // 0 after the last id: every later Open fails
	if d.next == 0 {
		d.next = comm
	}
	d.views[comm] = v
	if !d.on.Load() {
		if s, ok := d.tr.(Sharer); ok {
			s.ShareConns()
		}
		d.on.Store(true)
	}
	return v, nil
}

// wake wakes the driver of communicator comm, parked in its Wait.
func (d *Demux) wake(comm uint16) {
	if comm == 0 {
		d.tr.Wake()
		return
	}
	d.mu.Lock()
	v := d.views[comm]
	d.mu.Unlock()
	if v != nil {
		v.Wake()
	}
}

// wakeAll wakes every communicator's driver (a Conn failed).
func (d *Demux) wakeAll() {
	d.tr.Wake()
	d.mu.Lock()
	for _, v := range d.views {
		v.Wake()
	}
	d.mu.Unlock()
}

func (d *Demux) isDead(comm uint16) bool {
	if comm == 0 {
		return false
	}
	_, ok := d.dead.Load(comm)
	return ok
}

// viewPark bounds a view's Wait: a view cannot sleep in the transport's
// Wait (another communicator's driver owns it), so it sleeps until woken
// (a frame of its own stashed, Wake) or this long, and polls again.
const viewPark = time.Millisecond

// View is one communicator's Transport over a shared one (Demux.Open):
// its ranks mapped to the transport's, its frames marked with its id.
// Its Wait and Wake are its own; Close closes the view, not the transport.
// It offers no LL slots.
type View struct {
	d      *Demux
	comm   uint16
	ranks  []int
	conns  []viewConn
	wake   chan struct{}
	timer  *time.Timer // Wait's, made at its first park
	closed atomic.Bool
}

var _ Transport = (*View)(nil)

// Comm is the view's communicator id.
func (v *View) Comm() uint16 { return v.comm }

// Name is the shared transport's.
func (v *View) Name() string { return v.d.tr.Name() }

// Streams is the shared transport's.
func (v *View) Streams() int { return v.d.streams }

// Conn returns the stream-th stream to the view's rank peer.
func (v *View) Conn(peer, stream int) Conn { return &v.conns[peer*v.d.streams+stream] }

// Wait parks until the view is woken or timeout (at most viewPark) passes.
func (v *View) Wait(timeout time.Duration) error {
	if v.closed.Load() {
		return fault.New(fault.ErrClosed, v.d.rank, "communicator %d closed", v.comm)
	}
	timeout = min(timeout, viewPark)
	if v.timer == nil {
		v.timer = time.NewTimer(timeout)
	} else {
		v.timer.Reset(timeout)
	}
	select {
	case <-v.wake:
		v.timer.Stop()
	case <-v.timer.C:
	}
	return nil
}

// Wake makes a concurrent or the next Wait return at once.
func (v *View) Wake() {
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

// Stats are the shared transport's counters of the view's ranks (all
// communicators' bytes: the streams are the same).
func (v *View) Stats() Stats {
	all := v.d.tr.Stats()
	s := Stats{BytesSent: make([]uint64, len(v.ranks)), BytesReceived: make([]uint64, len(v.ranks)), Rejected: all.Rejected}
	for i, r := range v.ranks {
		if r < len(all.BytesSent) {
			s.BytesSent[i], s.BytesReceived[i] = all.BytesSent[r], all.BytesReceived[r]
		}
	}
	return s
}

// Close closes the view: frames still coming for it are dropped, and what
// it had stashed is freed. The transport stays open. A frame that was
// landing in one of its receives when it closed lands to its end.
func (v *View) Close() error {
	if !v.closed.CompareAndSwap(false, true) {
		return nil
	}
	d := v.d
	d.dead.Store(v.comm, struct{}{})
	d.mu.Lock()
	delete(d.views, v.comm)
	d.mu.Unlock()
	for _, dc := range d.conns {
		if dc != nil {
			dc.mu.Lock()
			dc.forget(v.comm)
			dc.mu.Unlock()
		}
	}
	v.Wake()
	return nil
}

// viewConn is one communicator's side of a shared Conn.
type viewConn struct {
	dc   *demuxConn
	comm uint16
}

// Vectored reports whether the shared Conn moves vectored payloads: gather
// sends go through as they are, scattered receives of a frame read by
// another communicator are copied from its stash.
func (c *viewConn) Vectored() bool {
	vc, ok := c.dc.under.(VecConn)
	return ok && vc.Vectored()
}

// TrySend sends op's frame marked with the communicator's id once no other
// communicator's frame is going out on the Conn.
func (c *viewConn) TrySend(op *SendOp) (bool, error) {
	op.Hdr.Comm = c.comm
	dc := c.dc
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.send(c.comm, op)
}

// TryRecv receives the communicator's next frame on the Conn: from its
// stash, or from the Conn, stashing the frames of others it reads first.
func (c *viewConn) TryRecv(op *RecvOp) (bool, error) {
	op.Want.Comm = c.comm
	dc := c.dc
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.recv(c.comm, op)
}

// demuxConn is a shared Conn and its demultiplexing state, guarded by mu.
type demuxConn struct {
	d     *Demux
	under Conn
	peer  int
	mu    sync.Mutex

	// Sends: the op whose frame is going out, its communicator, and the
	// communicators that found the direction taken (woken when it frees).
	sop     *SendOp
	sopComm uint16
	swait   []uint16

	// Receives: rop reads every frame; pump is the communicator whose call
	// reads now; landing is the receive the frame in flight lands in (nil:
	// buf, for the stash).
	rop     RecvOp
	pump    uint16
	landing *RecvOp
	buf     []byte
	owners  []recvOwner // per communicator, the receive that owns its direction
	stash   []stashed   // frames read for communicators not polling, in order
	err     error       // the Conn failed: every communicator sees it
}

// recvOwner is the receive of one communicator that owns its receive
// direction of the Conn (the Conn contract, per communicator). done: its
// frame has landed, n payload bytes (progress: of header and payload); its
// op learns it in its own communicator's call, since its driver reads the
// op's progress without the lock.
type recvOwner struct {
	comm     uint16
	op       *RecvOp
	done     bool
	n        int
	progress int
}

// finish completes the receive of owner i and drops it.
func (dc *demuxConn) finish(i int) (bool, error) {
	o := &dc.owners[i]
	o.op.N, o.op.Progress = o.n, o.progress
	dc.dropOwner(i)
	return true, nil
}

type stashed struct {
	hdr  Header
	data []byte
}

func (dc *demuxConn) send(comm uint16, op *SendOp) (bool, error) {
	if dc.sop != nil && dc.sop != op {
		if !dc.d.isDead(dc.sopComm) {
			if !slices.Contains(dc.swait, comm) {
				dc.swait = append(dc.swait, comm)
			}
			return false, nil
		}
		// Its communicator closed midway: finish the frame for it, or the
		// stream would stay mid-frame for everyone.
		done, err := dc.under.TrySend(dc.sop)
		if !done && err == nil {
			return false, nil
		}
		dc.sop = nil
		if err != nil {
			return false, err
		}
	}
	done, err := dc.under.TrySend(op)
	if done || err != nil {
		dc.sop = nil
		for _, w := range dc.swait {
			if w != comm {
				dc.d.wake(w)
			}
		}
		dc.swait = dc.swait[:0]
		return done, err
	}
	dc.sop, dc.sopComm = op, comm
	return false, nil
}

func (dc *demuxConn) owner(comm uint16) int {
	for i := range dc.owners {
		if dc.owners[i].comm == comm {
			return i
		}
	}
	return -1
}

func (dc *demuxConn) dropOwner(i int) {
	last := len(dc.owners) - 1
	dc.owners[i] = dc.owners[last]
	dc.owners[last] = recvOwner{}
	dc.owners = dc.owners[:last]
}

// takeStash takes the first frame stashed for comm.
func (dc *demuxConn) takeStash(comm uint16) (stashed, bool) {
	for i := range dc.stash {
		if dc.stash[i].hdr.Comm == comm {
			f := dc.stash[i]
			copy(dc.stash[i:], dc.stash[i+1:])
			dc.stash[len(dc.stash)-1] = stashed{}
			dc.stash = dc.stash[:len(dc.stash)-1]
			return f, true
		}
	}
	return stashed{}, false
}

// forget drops a closed communicator's receive and stashed frames.
func (dc *demuxConn) forget(comm uint16) {
	if i := dc.owner(comm); i >= 0 {
		dc.dropOwner(i)
	}
	for {
		if _, ok := dc.takeStash(comm); !ok {
			break
		}
	}
}

func (dc *demuxConn) recv(comm uint16, op *RecvOp) (bool, error) {
	i := dc.owner(comm)
	switch {
	case i < 0:
		if err := checkRecv(op, dc.peer); err != nil {
			return false, err
		}
		op.Progress, op.N, op.Got, op.Started = 0, 0, Header{}, false
		dc.owners = append(dc.owners, recvOwner{comm: comm, op: op})
		i = len(dc.owners) - 1
	case dc.owners[i].op != op:
		return false, nil // another receive of comm owns the direction
	case dc.owners[i].done:
		return dc.finish(i)
	}
	if f, ok := dc.takeStash(comm); ok {
		dc.dropOwner(i)
		return dc.deliver(op, f)
	}
	if dc.err != nil {
		dc.dropOwner(i)
		return false, dc.err
	}
	dc.pump = comm
	for {
		done, err := dc.under.TryRecv(&dc.rop)
		if err != nil {
			dc.err = err
			dc.dropOwner(dc.owner(comm))
			dc.d.wakeAll()
			return false, err
		}
		if !done {
			return false, nil
		}
		dc.landed()
		j := dc.owner(comm)
		if dc.owners[j].done {
			return dc.finish(j)
		}
		if f, ok := dc.takeStash(comm); ok {
			dc.dropOwner(j)
			return dc.deliver(op, f)
		}
	}
}

// checkRecv refuses a malformed receive, as RecvSide.Claim does.
func checkRecv(op *RecvOp, peer int) error {
	var s RecvSide
	_, _, err := s.Claim(op, peer, "shared")
	return err
}

// maxStash bounds the frame a stash takes: a larger length is no frame of
// a2a's (the peer lost framing).
const maxStash = 1 << 40

// route decides where the frame whose header rop holds lands (rop.Route):
// in the polling communicator's own receive when the frame is its, else in
// a buffer for the stash. A frame its receive refuses is stashed too, and
// the receive takes the mismatch from there: the stream stays framed for
// the other communicators.
func (dc *demuxConn) route(peer int) ([]byte, error) {
	got := &dc.rop.Got
	dc.landing = nil
	if got.Comm == dc.pump {
		if i := dc.owner(got.Comm); i >= 0 && !dc.owners[i].done && dc.owners[i].op.DstVec == nil {
			op := dc.owners[i].op
			op.Got = *got
			if dst, err := op.Land(peer); err == nil {
				op.Started = true
				dc.landing = op
				return dst, nil
			}
			op.Got = Header{}
		}
	}
	if got.Len > maxStash {
		return nil, fault.New(fault.ErrMismatch, peer, "data-plane message (frame) of %d bytes from rank %d on a shared stream: the peer lost framing", got.Len, peer)
	}
	dc.buf = make([]byte, got.Len)
	return dc.buf, nil
}

// landed finishes the frame rop just read: the receive it landed in is
// done, or the stash holds it. The communicator it belongs to is woken
// when it is not the one reading.
func (dc *demuxConn) landed() {
	got := dc.rop.Got
	if op := dc.landing; op != nil {
		dc.landing = nil
		for i := range dc.owners {
			if o := &dc.owners[i]; o.op == op {
				o.done, o.n, o.progress = true, dc.rop.N, dc.rop.Progress
			}
		}
		if got.Comm != dc.pump {
			dc.d.wake(got.Comm)
		}
		return
	}
	buf := dc.buf
	dc.buf = nil
	if dc.d.isDead(got.Comm) {
		return
	}
	dc.stash = append(dc.stash, stashed{hdr: got, data: buf[:dc.rop.N]})
	if got.Comm != dc.pump {
		dc.d.wake(got.Comm)
	}
}

// deliver lands stashed frame f in op, as the transport would have.
func (dc *demuxConn) deliver(op *RecvOp, f stashed) (bool, error) {
	op.Got = f.hdr
	op.Started = true
	if op.DstVec != nil {
		if err := op.Want.Check(&op.Got, false); err != nil {
			return false, err
		}
		n := 0
		for _, b := range op.DstVec {
			n += copy(b, f.data[n:])
		}
	} else {
		dst, err := op.Land(dc.peer)
		if err != nil {
			return false, err
		}
		copy(dst, f.data)
	}
	op.N = len(f.data)
	op.Progress = HeaderSize + op.N
	return true, nil
}
