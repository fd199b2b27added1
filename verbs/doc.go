// Package verbs is a thin binding to libibverbs (rdma-core), loaded at run time: device
// list, protection domains, memory regions, completion queues with their channels, RC queue
// pairs, posting and polling, GIDs. The a2a verbs transport (a2a/transport/verbs) is built
// on it; it depends on nothing else of a2a and can be used on its own.
//
// # Loading
//
// The package never includes <infiniband/verbs.h> and never links libibverbs: ibvcore.h
// declares the few structs and enums it uses with the layout of rdma-core's libibverbs 1.1
// ABI, and [Load] dlopens "libibverbs.so.1" and resolves the exported functions with
// dlvsym at their versions (IBVERBS_1.1, the completion channel ones IBVERBS_1.0), as
// NCCL's ibvwrap does. So `go build` works on any machine with a C compiler, one binary
// uses RDMA wherever a device exists, and where the library, a device or an active port is
// missing the calls return an error matching [ErrUnavailable] that says why (built without
// cgo, the dlopen error, no device, a port down, no RoCE v2 GID, ...), never a crash.
//
// ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are static inline
// functions in verbs.h; this package calls them the way their bodies do, through the
// function pointers of the device context's ops.
//
// # Objects
//
// [Lib] → [Context] (an opened device) → [PD], [CompChannel], [CQ] → [MR], [QP]. Close
// them in reverse order: QPs, MRs, CQs, completion channels, PDs, then the Context. Every
// Close is idempotent. Objects are not safe for concurrent use unless a method says so;
// libibverbs itself makes posting and polling of distinct QPs and CQs thread-safe.
//
// # Memory registration
//
// [PD.RegMR] pins memory for the device. Register only memory that the Go heap does not
// own: an mmap'ed region (unix.Mmap, a2a.AllocBuffer's segments), C memory. The Go runtime
// may return heap pages to the OS (and Soft-RoCE on Linux 6.1 has no on-demand paging), so
// a registration of heap memory can silently point at other pages later; copy Go-heap data
// through a registered pool instead. Registration counts against RLIMIT_MEMLOCK unless the
// process has CAP_IPC_LOCK: [CheckMemlock] says clearly when the limit is too low, and
// RegMR's error does too.
//
// # Completions
//
// [CQ.Poll] fills a caller-owned []WC without allocating. [CQ.Wait] is the parking rule of
// the transport: it arms the CQ (ibv_req_notify_cq), polls once more (a completion that
// arrived before the arming would raise no event), then sleeps in poll(2) on the
// completion channel's fd together with a caller's wake-up fd. The channel fd is
// non-blocking, events are acknowledged as they are read, so destroying a CQ never waits.
//
// # Selection
//
// [Lib.Endpoints] picks the ports to use: ACTIVE ports of the devices named by A2A_IB_HCA
// (NCCL's NCCL_IB_HCA syntax: "mlx5_0:1,mlx5_1", a leading "^" excludes, a leading "="
// matches names exactly instead of by prefix), addressed on RoCE by the RoCE v2
// IPv4-mapped (::ffff:a.b.c.d) GID unless A2A_IB_GID_INDEX names one, and on InfiniBand by
// the LID. See [ConfigFromEnv].
package verbs
