package verbs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultLibrary is the soname Load opens.
const DefaultLibrary = "libibverbs.so.1"

// Lib is a loaded libibverbs. It is never unloaded (providers and open contexts may
// outlive any one user), and it is safe for concurrent use.
type Lib struct {
	fns  *cFns
	name string
}

// loaded keeps one Lib per name: a dlopen'ed library is process-wide state anyway, and a
// program that loads it for every connection would otherwise grow a function table each
// time.
var loaded struct {
	sync.Mutex
	libs map[string]*Lib
}

// Load opens libibverbs (DefaultLibrary). The error matches ErrUnavailable when the
// library is missing or lacks a function this package needs.
func Load() (*Lib, error) { return LoadLibrary(DefaultLibrary) }

// LoadLibrary opens the named libibverbs (a soname or a path). Loading a name again
// returns the same Lib.
func LoadLibrary(name string) (*Lib, error) {
	if !haveCgo {
		return nil, unavailable(nil, "this binary was built without cgo (CGO_ENABLED=0)")
	}
	loaded.Lock()
	defer loaded.Unlock()
	if l := loaded.libs[name]; l != nil {
		return l, nil
	}
	f, reason := cLoad(name)
	if f == nil {
		return nil, unavailable(nil, "cannot load %s: %s", name, reason)
	}
	l := &Lib{fns: f, name: name}
	if loaded.libs == nil {
		loaded.libs = map[string]*Lib{}
	}
	loaded.libs[name] = l
	return l, nil
}

// Devices describes every device the library finds, with ports and GID tables. An empty
// list with a nil error means the library works but found no device.
func (l *Lib) Devices() ([]Device, error) {
	list, devs, names, err := l.deviceList()
	if err != nil {
		return nil, err
	}
	defer cFreeDevices(l.fns, list)
	out := make([]Device, 0, len(devs))
	for i, d := range devs {
		c, err := cOpenDevice(l.fns, d)
		if err != nil {
			return nil, unavailable(err, "cannot open %s (ibv_open_device; access to /dev/infiniband?)", names[i])
		}
		ctx := &Context{lib: l, c: c, name: names[i]}
		dev, err := ctx.Describe()
		ctx.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, dev)
	}
	slices.SortFunc(out, func(a, b Device) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Open opens the named device.
func (l *Lib) Open(name string) (*Context, error) {
	list, devs, names, err := l.deviceList()
	if err != nil {
		return nil, err
	}
	defer cFreeDevices(l.fns, list)
	i := slices.Index(names, name)
	if i < 0 {
		return nil, unavailable(nil, "no RDMA device %q (found %s)", name, listOrNone(names))
	}
	c, err := cOpenDevice(l.fns, devs[i])
	if err != nil {
		return nil, unavailable(err, "cannot open %s (ibv_open_device; access to /dev/infiniband?)", name)
	}
	return &Context{lib: l, c: c, name: name}, nil
}

func (l *Lib) deviceList() (unsafe.Pointer, []*cDevice, []string, error) {
	list, devs, names, err := cDevices(l.fns)
	if errnoIs(err, syscall.ENOSYS) {
		return nil, nil, nil, unavailable(err, "the kernel has no RDMA support (ib_uverbs not loaded or not built)")
	}
	if err != nil {
		return nil, nil, nil, unavailable(err, "ibv_get_device_list")
	}
	return list, devs, names, nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// Context is an opened device.
type Context struct {
	lib  *Lib
	c    *cContext
	name string
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Close closes the device. Close what was made from it first.
func (c *Context) Close() error {
	if c.c == nil {
		return nil
	}
	err := cCloseDevice(c.lib.fns, c.c)
	c.c = nil
	if err != nil {
		return callError("ibv_close_device", err)
	}
	return nil
}

// Describe queries the device, its ports and their GID tables.
func (c *Context) Describe() (Device, error) {
	a, err := cQueryDevice(c.lib.fns, c.c)
	if err != nil {
		return Device{}, callError("ibv_query_device("+c.name+")", err)
	}
	d := Device{
		Name: c.name, FWVer: a.fwVer, NodeGUID: a.nodeGUID, VendorID: a.vendorID, PartID: a.partID,
		MaxQP: a.maxQP, MaxQPWR: a.maxQPWR, MaxSGE: a.maxSGE, MaxCQ: a.maxCQ, MaxCQE: a.maxCQE,
		MaxMR: a.maxMR, MaxMRSize: a.maxMRSize,
	}
	total := 0
	for p := 1; p <= a.physPortCnt; p++ {
		pa, err := cQueryPort(c.lib.fns, c.c, p)
		if err != nil {
			return Device{}, callError(fmt.Sprintf("ibv_query_port(%s, %d)", c.name, p), err)
		}
		d.Ports = append(d.Ports, Port{
			Num: p, State: pa.state, PhysState: pa.physState, LinkLayer: pa.linkLayer,
			MaxMTU: pa.maxMTU, ActiveMTU: pa.activeMTU, LID: pa.lid,
		})
		total += pa.gidTblLen
	}
	// One call for all valid GIDs and their types where the library has it; else entry by
	// entry (rxe's table has 1024 slots), types from sysfs.
	table, ok, err := cGIDTable(c.lib.fns, c.c, total)
	if err != nil {
		ok = false
	}
	for i := range d.Ports {
		p := &d.Ports[i]
		if ok {
			for _, e := range table {
				if e.port == p.Num {
					p.GIDs = append(p.GIDs, GIDEntry{Index: e.index, GID: e.gid, Type: e.typ, Netdev: ifname(e.ifindex)})
				}
			}
			slices.SortFunc(p.GIDs, func(a, b GIDEntry) int { return a.Index - b.Index })
			continue
		}
		pa, err := cQueryPort(c.lib.fns, c.c, p.Num)
		if err != nil {
			return Device{}, callError("ibv_query_port", err)
		}
		for idx := 0; idx < pa.gidTblLen; idx++ {
			g, err := cQueryGID(c.lib.fns, c.c, p.Num, idx)
			if err != nil || g.IsZero() {
				continue
			}
			typ, ndev := sysfsGIDAttrs(c.name, p.Num, idx)
			p.GIDs = append(p.GIDs, GIDEntry{Index: idx, GID: g, Type: typ, Netdev: ndev})
		}
	}
	return d, nil
}

func ifname(index int) string {
	if index <= 0 {
		return ""
	}
	if i, err := net.InterfaceByIndex(index); err == nil {
		return i.Name
	}
	return ""
}

// sysfsGIDAttrs reads a GID's type and network device from sysfs.
func sysfsGIDAttrs(dev string, port, index int) (GIDType, string) {
	dir := filepath.Join("/sys/class/infiniband", dev, "ports", strconv.Itoa(port), "gid_attrs")
	typ := GIDTypeUnknown
	if b, err := os.ReadFile(filepath.Join(dir, "types", strconv.Itoa(index))); err == nil {
		switch s := strings.TrimSpace(string(b)); {
		case strings.Contains(s, "v2"):
			typ = GIDTypeRoCEv2
		case strings.Contains(s, "RoCE"):
			typ = GIDTypeRoCEv1
		case s == "IB":
			typ = GIDTypeIB
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "ndevs", strconv.Itoa(index)))
	return typ, strings.TrimSpace(string(b))
}

// QueryPort returns a port's state (without its GID table).
func (c *Context) QueryPort(port int) (Port, error) {
	pa, err := cQueryPort(c.lib.fns, c.c, port)
	if err != nil {
		return Port{}, callError(fmt.Sprintf("ibv_query_port(%s, %d)", c.name, port), err)
	}
	return Port{Num: port, State: pa.state, PhysState: pa.physState, LinkLayer: pa.linkLayer,
		MaxMTU: pa.maxMTU, ActiveMTU: pa.activeMTU, LID: pa.lid}, nil
}

// QueryGID returns one GID table entry.
func (c *Context) QueryGID(port, index int) (GID, error) {
	g, err := cQueryGID(c.lib.fns, c.c, port, index)
	if err != nil {
		return GID{}, callError(fmt.Sprintf("ibv_query_gid(%s, %d, %d)", c.name, port, index), err)
	}
	return g, nil
}

// PD is a protection domain.
type PD struct {
	ctx *Context
	p   *cPD
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	p, err := cAllocPD(c.lib.fns, c.c)
	if err != nil {
		return nil, callError("ibv_alloc_pd("+c.name+")", err)
	}
	return &PD{ctx: c, p: p}, nil
}

// Close frees the protection domain. Deregister its MRs and destroy its QPs first.
func (pd *PD) Close() error {
	if pd.p == nil {
		return nil
	}
	err := cDeallocPD(pd.ctx.lib.fns, pd.p)
	pd.p = nil
	if err != nil {
		return callError("ibv_dealloc_pd", err)
	}
	return nil
}

// MR is a registered memory region.
type MR struct {
	pd   *PD
	m    *cMR
	addr uintptr
	n    int
	lkey uint32
	rkey uint32
}

// RegMR registers buf for the device with the given access rights (AccessLocalWrite to
// receive into it, AccessRemoteWrite and AccessRemoteRead for a peer's RDMA operations).
// buf must not be Go heap memory (see the package documentation): map it with unix.Mmap,
// or allocate it in C. It stays registered, and must stay mapped, until Close.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, invalidf("RegMR of an empty buffer")
	}
	addr := uintptr(unsafe.Pointer(&buf[0]))
	m, lkey, rkey, err := cRegMR(pd.ctx.lib.fns, pd.p, addr, len(buf), access)
	if err != nil {
		if mlErr := CheckMemlock(uint64(len(buf))); mlErr != nil {
			return nil, fmt.Errorf("verbs: ibv_reg_mr of %d bytes: %w (%w)", len(buf), mlErr, err)
		}
		return nil, callError(fmt.Sprintf("ibv_reg_mr of %d bytes at %#x", len(buf), addr), err)
	}
	return &MR{pd: pd, m: m, addr: addr, n: len(buf), lkey: lkey, rkey: rkey}, nil
}

// LKey is the key local work requests name the region by.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey is the key a peer names the region by in RDMA operations.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Addr is the region's start address.
func (mr *MR) Addr() uint64 { return uint64(mr.addr) }

// Len is the region's length in bytes.
func (mr *MR) Len() int { return mr.n }

// SGE describes length bytes at offset off of the region.
func (mr *MR) SGE(off, length int) SGE {
	return SGE{Addr: uint64(mr.addr) + uint64(off), Length: uint32(length), LKey: mr.lkey}
}

// Close deregisters the region.
func (mr *MR) Close() error {
	if mr.m == nil {
		return nil
	}
	err := cDeregMR(mr.pd.ctx.lib.fns, mr.m)
	mr.m = nil
	if err != nil {
		return callError("ibv_dereg_mr", err)
	}
	return nil
}

// CompChannel is a completion channel: a file descriptor that becomes readable when an
// armed CQ attached to it gets a completion.
type CompChannel struct {
	ctx *Context
	ch  *cChannel
	fd  int
}

// NewCompChannel creates a completion channel with a non-blocking fd.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	ch, fd, err := cCreateCompChannel(c.lib.fns, c.c)
	if err != nil {
		return nil, callError("ibv_create_comp_channel("+c.name+")", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		cDestroyCompChannel(c.lib.fns, ch)
		return nil, fmt.Errorf("verbs: completion channel fd: %w", err)
	}
	return &CompChannel{ctx: c, ch: ch, fd: fd}, nil
}

// Fd is the channel's file descriptor, for poll/epoll beside other wake-up sources.
func (ch *CompChannel) Fd() int { return ch.fd }

// Drain reads and acknowledges every pending event without blocking and says how many
// there were. Each event disarms its CQ: arm it again before waiting on it.
func (ch *CompChannel) Drain() (int, error) {
	n := 0
	for {
		_, err := cGetCQEvent(ch.ctx.lib.fns, ch.ch)
		if err == nil {
			n++
			continue
		}
		if errnoIs(err, syscall.EAGAIN) {
			return n, nil
		}
		return n, callError("ibv_get_cq_event", err)
	}
}

// Close destroys the channel. Destroy its CQs first.
func (ch *CompChannel) Close() error {
	if ch.ch == nil {
		return nil
	}
	err := cDestroyCompChannel(ch.ctx.lib.fns, ch.ch)
	ch.ch = nil
	if err != nil {
		return callError("ibv_destroy_comp_channel", err)
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	ctx *Context
	cq  *cCQ
	ch  *CompChannel
	cqe int
}

// NewCQ creates a CQ of at least cqe entries, attached to ch (nil: none; then it cannot
// Wait).
func (c *Context) NewCQ(cqe int, ch *CompChannel) (*CQ, error) {
	var cch *cChannel
	if ch != nil {
		cch = ch.ch
	}
	cq, got, err := cCreateCQ(c.lib.fns, c.c, cqe, cch)
	if err != nil {
		return nil, callError(fmt.Sprintf("ibv_create_cq(%s, %d)", c.name, cqe), err)
	}
	return &CQ{ctx: c, cq: cq, ch: ch, cqe: got}, nil
}

// Size is the number of entries the CQ holds.
func (cq *CQ) Size() int { return cq.cqe }

// Poll moves up to len(wc) completions into wc without blocking or allocating and says
// how many. Check each one's Status (WC.Err).
func (cq *CQ) Poll(wc []WC) (int, error) {
	n, err := cPollCQ(cq.cq, wc)
	if err != nil {
		return 0, callError("ibv_poll_cq", err)
	}
	return n, nil
}

// Arm requests an event on the completion channel for the CQ's next completion (only the
// next solicited one if solicitedOnly). Completions already queued raise none: poll after
// arming.
func (cq *CQ) Arm(solicitedOnly bool) error {
	if err := cReqNotifyCQ(cq.cq, solicitedOnly); err != nil {
		return callError("ibv_req_notify_cq", err)
	}
	return nil
}

// Wait polls the CQ into wc and, if that finds nothing, parks: it arms the CQ, polls once
// more, then sleeps until the completion channel or wakeFd (if >= 0) is readable or
// timeout passes (negative: no limit). It returns the completions it found; 0 means
// wakeFd became readable (Wait does not read it), the timeout passed, or a spurious
// wake-up: the caller loops. No completion is lost between the arming and the sleep.
func (cq *CQ) Wait(wc []WC, wakeFd int, timeout time.Duration) (int, error) {
	if cq.ch == nil {
		return 0, invalidf("Wait on a CQ without a completion channel")
	}
	if n, err := cq.Poll(wc); n > 0 || err != nil {
		return n, err
	}
	if err := cq.Arm(false); err != nil {
		return 0, err
	}
	if n, err := cq.Poll(wc); n > 0 || err != nil {
		return n, err
	}
	fds := []unix.PollFd{{Fd: int32(cq.ch.fd), Events: unix.POLLIN}, {Fd: int32(wakeFd), Events: unix.POLLIN}}
	if wakeFd < 0 {
		fds = fds[:1]
	}
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
		return 0, fmt.Errorf("verbs: poll on the completion channel: %w", err)
	}
	if fds[0].Revents != 0 {
		if _, err := cq.ch.Drain(); err != nil {
			return 0, err
		}
	}
	return cq.Poll(wc)
}

// Close destroys the CQ. Destroy the QPs using it first.
func (cq *CQ) Close() error {
	if cq.cq == nil {
		return nil
	}
	err := cDestroyCQ(cq.ctx.lib.fns, cq.cq)
	cq.cq = nil
	if err != nil {
		return callError("ibv_destroy_cq", err)
	}
	return nil
}

// QPConfig says how to create a QP.
type QPConfig struct {
	SendCQ, RecvCQ *CQ    // where send and receive completions go; may be the same CQ
	Caps           QPCaps // zero fields take 64 WRs, 1 SGE, no inline data
}

// QP is a reliable-connected queue pair.
type QP struct {
	pd    *PD
	q     *cQP
	qpn   uint32
	caps  QPCaps
	state int
}

// NewRCQP creates a reliable-connected QP in the RESET state.
func (pd *PD) NewRCQP(cfg QPConfig) (*QP, error) {
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, invalidf("NewRCQP needs a send and a receive CQ")
	}
	caps := cfg.Caps
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&caps.MaxSendWR, 64)
	def(&caps.MaxRecvWR, 64)
	def(&caps.MaxSendSGE, 1)
	def(&caps.MaxRecvSGE, 1)
	q, qpn, got, err := cCreateQP(pd.ctx.lib.fns, pd.p, cfg.SendCQ.cq, cfg.RecvCQ.cq, qptRC, caps)
	if err != nil {
		return nil, callError(fmt.Sprintf("ibv_create_qp(RC, %+v)", caps), err)
	}
	return &QP{pd: pd, q: q, qpn: qpn, caps: got, state: qpsReset}, nil
}

// QPN is the QP's number, which the peer's QP connects to.
func (qp *QP) QPN() uint32 { return qp.qpn }

// Caps are the queue sizes the provider granted.
func (qp *QP) Caps() QPCaps { return qp.caps }

// Addr is what a peer needs to connect a QP to this one: ep is the local port the QP is
// used on, psn the first packet sequence number it sends (pass the same to Connect). Send
// it to the peer over a channel you trust, and take the peer's Addr from one: the QP that
// Connect names may use every RKey of this side's regions it learns.
func (qp *QP) Addr(ep Endpoint, psn uint32) Addr {
	return Addr{QPN: qp.qpn, PSN: psn & 0xffffff, GID: ep.GID, LID: ep.LID, MTU: ep.MTU}
}

// Addr is the connection information of one QP, which the peer's QP.Connect takes.
type Addr struct {
	QPN uint32 // the QP's number
	PSN uint32 // the first packet sequence number the QP sends (24 bits)
	GID GID    // the port's GID on RoCE (zero on InfiniBand)
	LID uint16 // the port's LID on InfiniBand
	MTU MTU    // the active MTU of its port
}

// RandomPSN returns a random 24-bit initial packet sequence number.
func RandomPSN() uint32 { return rand.Uint32() & 0xffffff }

// ConnectOptions tune the RTR and RTS steps. Zero fields take the defaults in brackets.
type ConnectOptions struct {
	Access          Access // [local write, remote write, remote read]
	Timeout         int    // local ACK timeout, 4.096 us * 2^Timeout [14: 67 ms]
	RetryCount      int    // [7]
	RNRRetry        int    // [7: retry forever]
	MinRNRTimer     int    // [12: 0.64 ms]
	MaxRDAtomic     int    // outstanding RDMA reads/atomics as initiator [1]
	MaxDestRDAtomic int    // ... as responder [1]
	HopLimit        int    // GRH hop limit [64]
	TrafficClass    int    // GRH traffic class [0]
	SL              int    // service level [0]
}

func (o ConnectOptions) withDefaults() ConnectOptions {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if o.Access == 0 {
		o.Access = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	}
	def(&o.Timeout, 14)
	def(&o.RetryCount, 7)
	def(&o.RNRRetry, 7)
	def(&o.MinRNRTimer, 12)
	def(&o.MaxRDAtomic, 1)
	def(&o.MaxDestRDAtomic, 1)
	def(&o.HopLimit, 64)
	return o
}

// Init moves the QP from RESET to INIT on ep's port. Receives may be posted from INIT on.
func (qp *QP) Init(ep Endpoint, opt ConnectOptions) error {
	opt = opt.withDefaults()
	err := cModifyQP(qp.pd.ctx.lib.fns, qp.q, qpModify{state: qpsInit, port: ep.Port, access: opt.Access})
	if err != nil {
		return callError(fmt.Sprintf("ibv_modify_qp(QP %d, INIT, port %d)", qp.qpn, ep.Port), err)
	}
	qp.state = qpsInit
	return nil
}

// Connect moves the QP to RTS, connected to the remote QP: INIT (if still in RESET), RTR,
// RTS. ep is the local port; psn the QP's own first PSN, as published in its Addr.
func (qp *QP) Connect(ep Endpoint, psn uint32, remote Addr, opt ConnectOptions) error {
	opt = opt.withDefaults()
	if qp.state == qpsReset {
		if err := qp.Init(ep, opt); err != nil {
			return err
		}
	}
	mtu := ep.MTU
	if remote.MTU != 0 {
		mtu = min(mtu, remote.MTU)
	}
	rtr := qpModify{
		state: qpsRTR, port: ep.Port, mtu: mtu, destQPN: remote.QPN, rqPSN: remote.PSN & 0xffffff,
		maxDestRDAtomic: opt.MaxDestRDAtomic, minRNRTimer: opt.MinRNRTimer, dlid: remote.LID, sl: opt.SL,
	}
	if ep.Global() {
		rtr.global, rtr.dgid, rtr.sgidIndex = true, remote.GID, ep.GIDIndex
		rtr.hopLimit, rtr.trafficClass = opt.HopLimit, opt.TrafficClass
	}
	if err := cModifyQP(qp.pd.ctx.lib.fns, qp.q, rtr); err != nil {
		return callError(fmt.Sprintf("ibv_modify_qp(QP %d, RTR to QP %d at %v lid %d, mtu %v)",
			qp.qpn, remote.QPN, remote.GID, remote.LID, mtu), err)
	}
	qp.state = qpsRTR
	rts := qpModify{
		state: qpsRTS, sqPSN: psn & 0xffffff, timeout: opt.Timeout, retryCount: opt.RetryCount,
		rnrRetry: opt.RNRRetry, maxRDAtomic: opt.MaxRDAtomic,
	}
	if err := cModifyQP(qp.pd.ctx.lib.fns, qp.q, rts); err != nil {
		return callError(fmt.Sprintf("ibv_modify_qp(QP %d, RTS)", qp.qpn), err)
	}
	qp.state = qpsRTS
	return nil
}

// Reset moves the QP back to RESET from any state, dropping its posted work requests
// (their completions may still be in the CQ): Init and Connect may follow again, as after
// NewRCQP.
func (qp *QP) Reset() error {
	if err := cModifyQP(qp.pd.ctx.lib.fns, qp.q, qpModify{state: qpsReset}); err != nil {
		return callError(fmt.Sprintf("ibv_modify_qp(QP %d, RESET)", qp.qpn), err)
	}
	qp.state = qpsReset
	return nil
}

// SetError moves the QP to the error state: its outstanding work requests complete with
// WCWRFlushErr, and the peer's next operations fail (retry exceeded).
func (qp *QP) SetError() error {
	if err := cModifyQP(qp.pd.ctx.lib.fns, qp.q, qpModify{state: qpsErr}); err != nil {
		return callError(fmt.Sprintf("ibv_modify_qp(QP %d, ERR)", qp.qpn), err)
	}
	qp.state = qpsErr
	return nil
}

// PostSend posts one send work request with the SGE list sges (read during the call only).
func (qp *QP) PostSend(wr SendWR, sges []SGE) error {
	if err := cPostSend(qp.q, wr, sges); err != nil {
		return callError("ibv_post_send", err)
	}
	return nil
}

// PostRecv posts one receive work request with the SGE list sges.
func (qp *QP) PostRecv(id uint64, sges []SGE) error {
	if err := cPostRecv(qp.q, id, sges); err != nil {
		return callError("ibv_post_recv", err)
	}
	return nil
}

// PostRecvs posts len(ids) receive work requests at once, request i with the one element
// sges[i].
func (qp *QP) PostRecvs(ids []uint64, sges []SGE) error {
	if len(ids) != len(sges) {
		return invalidf("PostRecvs: %d ids, %d SGEs", len(ids), len(sges))
	}
	if err := cPostRecvs(qp.q, ids, sges); err != nil {
		return callError("ibv_post_recv", err)
	}
	return nil
}

// Close destroys the QP.
func (qp *QP) Close() error {
	if qp.q == nil {
		return nil
	}
	err := cDestroyQP(qp.pd.ctx.lib.fns, qp.q)
	qp.q = nil
	if err != nil {
		return callError("ibv_destroy_qp", err)
	}
	return nil
}
