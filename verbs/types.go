package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
)

// ErrUnavailable is matched (errors.Is) by every error saying that verbs cannot be used
// here: built without cgo, no libibverbs, no kernel support, no device, no usable port.
// The error's text gives the reason; a program can fall back to another way of moving
// data.
var ErrUnavailable = errors.New("verbs unavailable")

// UnavailableError says why verbs cannot be used. It matches ErrUnavailable.
type UnavailableError struct {
	Reason string // what is missing, for people
	Err    error  // the cause, if any
}

func (e *UnavailableError) Error() string {
	if e.Err != nil {
		return "verbs unavailable: " + e.Reason + ": " + e.Err.Error()
	}
	return "verbs unavailable: " + e.Reason
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrInvalidArgument is matched (errors.Is) by the errors of calls given arguments they
// cannot use: a malformed Config.HCA (or A2A_IB_HCA, A2A_IB_GID_INDEX in ConfigFromEnv),
// an empty buffer to register, a queue pair without completion queues, a Wait on a CQ
// without a completion channel.
var ErrInvalidArgument = errors.New("verbs: invalid argument")

// invalidf is an error matching ErrInvalidArgument, with its own text.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

func unavailable(err error, format string, args ...any) error {
	return &UnavailableError{Reason: fmt.Sprintf(format, args...), Err: err}
}

// callError names the verb that failed; errors.Is matches its errno (syscall.Errno).
func callError(verb string, err error) error {
	return fmt.Errorf("verbs: %s: %w", verb, err)
}

// MTU is a path MTU as the verbs encode it (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5).
type MTU uint32

// The MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b > 0 {
		return strconv.Itoa(b)
	}
	return "invalid(" + strconv.Itoa(int(m)) + ")"
}

// PortState is a port's logical state.
type PortState uint32

// The port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	names := [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	if int(s) < len(names) {
		return names[s]
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// PhysState is a port's physical state.
type PhysState uint8

func (s PhysState) String() string {
	names := [...]string{"", "SLEEP", "POLLING", "DISABLED", "PORT_CONFIGURATION_TRAINING", "LINK_UP",
		"LINK_ERROR_RECOVERY", "PHY_TEST"}
	if s > 0 && int(s) < len(names) {
		return names[s]
	}
	return "phys(" + strconv.Itoa(int(s)) + ")"
}

// LinkLayer is a port's link layer.
type LinkLayer uint8

// The link layers.
const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand:
		return "InfiniBand"
	case LinkEthernet:
		return "Ethernet"
	}
	return "unspecified"
}

// GIDType is the kind of a GID table entry.
type GIDType uint32

// The GID types; GIDTypeUnknown where neither the library nor sysfs said.
const (
	GIDTypeIB      GIDType = 0
	GIDTypeRoCEv1  GIDType = 1
	GIDTypeRoCEv2  GIDType = 2
	GIDTypeUnknown GIDType = 0xff
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// GID is a port's 128-bit global identifier (an IPv6 address on RoCE).
type GID [16]byte

// IsZero reports whether g is all zeros (an unused table entry).
func (g GID) IsZero() bool { return g == GID{} }

// IPv4 returns the IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), as RoCE v2 uses
// for an interface's IPv4 address.
func (g GID) IPv4() (netip.Addr, bool) {
	a := netip.AddrFrom16(g)
	if !a.Is4In6() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// GIDEntry is one valid entry of a port's GID table.
type GIDEntry struct {
	Index  int // the index in the table, as Config.GIDIndex names it
	GID    GID
	Type   GIDType
	Netdev string // the network device a RoCE GID belongs to, if known
}

// Port describes one port of a device.
type Port struct {
	Num       int // the port number, from 1
	State     PortState
	PhysState PhysState
	LinkLayer LinkLayer
	MaxMTU    MTU
	ActiveMTU MTU
	LID       uint16     // InfiniBand: 0 until a subnet manager assigns one
	GIDs      []GIDEntry // the valid entries, by index
}

// Device describes a device and its ports, as Lib.Devices and Context.Describe find them.
type Device struct {
	Name     string // the device's name (mlx5_0, rxe0), for Lib.Open
	FWVer    string // firmware version
	NodeGUID uint64 // as the device reports it (big-endian bytes)
	VendorID uint32
	PartID   uint32
	// The device's limits (ibv_device_attr): queue pairs, work requests per queue, SGEs
	// per work request, completion queues, entries per CQ, memory regions, bytes per MR.
	MaxQP     int
	MaxQPWR   int
	MaxSGE    int
	MaxCQ     int
	MaxCQE    int
	MaxMR     int
	MaxMRSize uint64
	Ports     []Port
}

type deviceAttr struct {
	fwVer                                        string
	nodeGUID, maxMRSize                          uint64
	vendorID, partID                             uint32
	maxQP, maxQPWR, maxSGE, maxCQ, maxCQE, maxMR int
	physPortCnt                                  int
}

type portAttr struct {
	state             PortState
	maxMTU, activeMTU MTU
	gidTblLen         int
	lid               uint16
	physState         PhysState
	linkLayer         LinkLayer
}

type gidTableEntry struct {
	gid     GID
	index   int
	port    int
	typ     GIDType
	ifindex int
}

// Access is a memory region's or QP's access flags.
type Access uint32

// The access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
)

// SGE is one scatter/gather element: Length bytes at Addr of the MR whose LKey it names.
// Its layout is struct ibv_sge's, so a []SGE goes to the library as it is.
type SGE struct {
	Addr   uint64 // an address inside the MR
	Length uint32 // in bytes
	LKey   uint32 // the MR's LKey
}

// Opcode is a send work request's operation.
type Opcode uint32

// The send operations.
const (
	OpRDMAWrite        Opcode = 0
	OpRDMAWriteWithImm Opcode = 1
	OpSend             Opcode = 2
	OpSendWithImm      Opcode = 3
	OpRDMARead         Opcode = 4
)

// SendFlags modify a send work request.
type SendFlags uint32

// The send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// SendWR is a send work request without its SGE list (passed beside it).
type SendWR struct {
	ID         uint64 // the caller's, returned in the completion's WC.ID
	Op         Opcode
	Flags      SendFlags // SendSignaled for a completion
	Imm        uint32    // immediate data, host order (the binding converts)
	RemoteAddr uint64    // RDMA operations: the target address in the peer's MR
	RKey       uint32    // RDMA operations: the peer MR's rkey
}

// WCStatus is a work completion's status.
type WCStatus uint32

// WCSuccess is the status of a successful completion; the others are errors.
const (
	WCSuccess        WCStatus = 0
	WCWRFlushErr     WCStatus = 5
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "WR flushed", "memory window bind error", "bad response error",
	"local access error", "remote invalid request error", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation error",
	"remote invalid RD request", "aborted error", "invalid EE context number", "invalid EE context state",
	"fatal error", "response timeout error", "general error", "TM error", "TM rendezvous incomplete",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// WCOpcode is the operation a work completion completes.
type WCOpcode uint32

// The completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCRecv            WCOpcode = 1 << 7
	WCRecvRDMAWithImm WCOpcode = 1<<7 + 1
)

// WCFlags qualify a work completion.
type WCFlags uint32

// WCWithImm says that the completion carries immediate data.
const WCWithImm WCFlags = 1 << 1

// WC is a work completion. Its layout is struct ibv_wc's: CQ.Poll fills a []WC in place.
// Only ID, Status, QPNum and VendorErr are valid in a failed completion.
type WC struct {
	ID           uint64   // the work request's ID
	Status       WCStatus // WCSuccess, or why the request failed (see Err)
	Opcode       WCOpcode // what completed
	VendorErr    uint32   // the provider's error code of a failed completion
	ByteLen      uint32   // receives: the bytes that arrived
	immBE        uint32
	QPNum        uint32  // the local QP the request was posted on
	SrcQP        uint32  // receives: the sending QP (meaningful on UD QPs)
	Flags        WCFlags // WCWithImm when Imm is valid
	PKeyIndex    uint16
	SLID         uint16 // receives: the sender's LID
	SL           uint8  // receives: the service level
	DLIDPathBits uint8
}

// Imm is the immediate data (host order) of a completion with WCWithImm.
func (w *WC) Imm() uint32 { return ntohl(w.immBE) }

// Err is nil for a successful completion, else an error naming the status.
func (w *WC) Err() error {
	if w.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: w.Status, VendorErr: w.VendorErr, ID: w.ID, QPNum: w.QPNum}
}

// WCError is a failed work completion: the WC's fields that say which and why.
type WCError struct {
	Status    WCStatus
	VendorErr uint32
	ID        uint64 // the work request's ID
	QPNum     uint32 // the QP it was posted on
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: work completion %d on QP %d: %v (vendor error %#x)", e.ID, e.QPNum, e.Status, e.VendorErr)
}

// QPCaps are a QP's queue sizes: asked for at creation, granted in QP.Caps.
type QPCaps struct {
	MaxSendWR, MaxRecvWR   int // work requests outstanding at once, per queue
	MaxSendSGE, MaxRecvSGE int // SGEs per work request
	MaxInline              int // bytes a send with SendInline may carry
}

// QP states used by the connection steps.
const (
	qpsReset = 0
	qpsInit  = 1
	qpsRTR   = 2
	qpsRTS   = 3
	qpsErr   = 6
	qptRC    = 2
)

type qpModify struct {
	state           int
	port            int
	pkeyIndex       int
	access          Access
	mtu             MTU
	destQPN, rqPSN  uint32
	maxDestRDAtomic int
	minRNRTimer     int
	global          bool
	dgid            GID
	sgidIndex       int
	hopLimit        int
	trafficClass    int
	dlid            uint16
	sl              int
	sqPSN           uint32
	timeout         int
	retryCount      int
	rnrRetry        int
	maxRDAtomic     int
}

func htonl(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

func ntohl(v uint32) uint32 {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return binary.BigEndian.Uint32(b[:])
}

func errnoIs(err error, e syscall.Errno) bool { return errors.Is(err, e) }
