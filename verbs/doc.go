// Package verbs is a Go binding to libibverbs, rdma-core's RDMA verbs library, loaded at
// run time. It covers what a program needs to move data over reliable-connected (RC) queue
// pairs on InfiniBand or RoCE: the device list with ports and GID tables, protection
// domains, memory regions, completion queues with completion channels, RC queue pairs and
// their connection steps, posting work requests and polling completions. It depends on no
// other package of its module; a2a's RDMA transport (package a2a/transport/verbs) is built
// on it.
//
// A program using it typically
//
//  1. calls [Load], picks a port with [Lib.Endpoints] and opens its device with [Lib.Open];
//  2. allocates a [PD], registers memory with [PD.RegMR], creates a [CompChannel], a [CQ]
//     and a [QP] ([PD.NewRCQP]);
//  3. sends the QP's [Addr] to the peer over a connection of its own (TCP, say), receives
//     the peer's, and calls [QP.Connect] with it;
//  4. posts receives and sends ([QP.PostRecv], [QP.PostSend]) and reaps their completions
//     ([CQ.Poll], [CQ.Wait]);
//  5. closes everything in reverse order.
//
// The package's Example does all of this with two QPs on one port connected to each other.
//
// # Loading
//
// The package never includes <infiniband/verbs.h> and never links libibverbs: ibvcore.h
// declares the few structs and enums it uses with the layout of rdma-core's libibverbs 1.1
// ABI, and [Load] dlopens "libibverbs.so.1" and resolves the exported functions with
// dlvsym at their versions (IBVERBS_1.1, the completion channel ones IBVERBS_1.0), as
// NCCL's ibvwrap does. So building needs cgo's C compiler but no RDMA package (without cgo
// the package builds too, and reports verbs unavailable), and one binary uses RDMA wherever
// a device exists. Where cgo, the library, kernel support, a device or an active port is
// missing, the calls return an error matching [ErrUnavailable] that says which (never a
// crash), so a program can fall back to something else.
//
// ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are static inline
// functions in verbs.h; this package calls them the way their bodies do, through the
// function pointers of the device context's ops.
//
// Loading a library name again returns the same [Lib], and a Lib is never unloaded: the
// dlopen'ed library and its providers are process-wide, and open devices may outlive any
// one user of them.
//
// # Objects
//
// [Lib] → [Context] (an opened device) → [PD], [CompChannel], [CQ] → [MR] (of a PD), [QP]
// (of a PD, with a send and a receive CQ). Close them in reverse order: QPs, MRs, CQs,
// completion channels, PDs, then the Context. Every Close is idempotent. Nothing is
// closed for you: an object never closed holds its kernel resources until the process
// exits.
//
// [PD.NewRCQP] creates a QP in the RESET state. [QP.Init] moves it to INIT, from which
// receives may be posted; [QP.Connect] moves it through RTR to RTS, connected to the
// peer's QP whose [Addr] it is given, with the packet sequence number this side chose
// ([RandomPSN]) and published in its own Addr. [QP.Reset] returns it to RESET for another
// connection; [QP.SetError] fails it, flushing its outstanding work requests.
//
// # Memory registration
//
// [PD.RegMR] pins memory for the device. Register only memory that the Go heap does not
// own: an mmap'ed region (unix.Mmap) or C memory. The Go runtime may return heap pages to
// the OS (and Soft-RoCE on Linux 6.1 has no on-demand paging), so a registration of heap
// memory can silently point at other pages later; copy Go-heap data through a registered
// buffer instead. The memory must stay mapped until the MR is closed.
//
// Local work requests name registered memory by [SGE]s ([MR.SGE]: address, length and the
// MR's LKey); a peer names it in RDMA operations by address ([MR.Addr]) and [MR.RKey],
// which the owner sends it along with its Addr. A peer may write only into a region
// registered with [AccessRemoteWrite], which needs [AccessLocalWrite] too, as does
// receiving into it.
//
// Registration counts against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK:
// [CheckMemlock] says clearly when the limit is too low, and RegMR's error does too.
//
// # Posting and completions
//
// [QP.PostSend] posts a [SendWR] (SEND, SEND WITH IMM, RDMA WRITE, RDMA WRITE WITH IMM or
// RDMA READ) with its SGE list. The SGE slice is read during the call only; the memory it
// names must stay untouched until the work request completes. Only requests with
// [SendSignaled] produce a completion, but unsignaled ones hold their send queue slot until
// a later signaled one completes, so signal at least one in every QPCaps.MaxSendWR.
//
// A SEND, and an RDMA WRITE WITH IMM, consume one receive that [QP.PostRecv] or
// [QP.PostRecvs] posted on the peer's QP: the SEND's data lands in that receive's SGEs, the
// write's where the writer said (its receive may have no SGE), and the immediate value
// arrives in the receive's completion. A plain RDMA WRITE or READ consumes no receive and
// raises no completion on the peer.
//
// [CQ.Poll] fills a caller-owned []WC without blocking or allocating; check each [WC]'s
// status with [WC.Err]. [CQ.Wait] parks until there is something to poll: it arms the CQ
// (ibv_req_notify_cq), polls once more (a completion that arrived before the arming would
// raise no event), then sleeps in poll(2) on the completion channel's fd together with a
// wake-up fd of the caller's, so another goroutine can end the wait (an eventfd, say). The
// channel fd is non-blocking and events are acknowledged as they are read, so destroying a
// CQ never waits. A program with its own event loop can use [CQ.Arm], [CompChannel.Fd] and
// [CompChannel.Drain] instead.
//
// # Selection
//
// [Endpoints] (and [Lib.Endpoints]) picks the ports to use, described by a [Config]: the
// ACTIVE ports of the devices that Config.HCA names, in NCCL_IB_HCA's syntax ("mlx5_0:1,
// mlx5_1"; a leading "^" excludes, a leading "=" matches names exactly instead of by
// prefix); on RoCE addressed by the RoCE v2 IPv4-mapped (::ffff:a.b.c.d) GID unless
// Config.GIDIndex names one, on InfiniBand by the LID. A program fills Config itself;
// [ConfigFromEnv] fills it from A2A_IB_HCA and A2A_IB_GID_INDEX, the variables a2a's
// users set, and the errors of Endpoints call the two fields by those names.
//
// # Errors
//
//   - [ErrUnavailable] (an [*UnavailableError] with the reason): verbs cannot be used
//     here: built without cgo, no libibverbs, no kernel support, no device, no usable port.
//   - [ErrInvalidArgument]: a call was given what it cannot use: a malformed Config or
//     environment variable, an empty buffer to register, a QP without CQs.
//   - [ErrMemlock]: RLIMIT_MEMLOCK forbids a registration; the error says how to raise it.
//   - A verb that fails returns an error naming it (ibv_reg_mr, ibv_modify_qp, ...) and
//     wrapping its errno: errors.Is(err, syscall.ENOMEM) matches.
//   - A work request that fails does so in its completion: [WC.Err] returns a [*WCError]
//     with the status (errors.As).
//
// # Concurrency
//
// A [Lib] is safe for concurrent use. The other objects add no locking of their own:
// different goroutines may post on different QPs and poll different CQs at the same time,
// as libibverbs allows, but use one QP or one CQ from one goroutine at a time (or
// serialise the calls yourself), let only one goroutine Wait on a completion channel's CQs
// at a time (Wait drains the channel's events), and close an object only when no call on
// it, or on an object made from it, is in flight.
package verbs
