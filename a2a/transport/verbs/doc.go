// Package verbs is the RDMA data plane: reliable-connected queue pairs over
// libibverbs (package ibv, loaded at run time), one per peer and stream.
//
// # Connection
//
// [Provider.Listen] opens every selected port (A2A_IB_HCA, A2A_IB_GID_INDEX;
// RoCE v2's IPv4-mapped GID by default, the LID on InfiniBand), creates a QP
// in INIT for every (rank, stream) with its receives posted, and registers
// the receive rings and the LL window. The address it announces through the
// job's authenticated rendezvous carries, per port, the GID, LID, MTU, PSN,
// the QPN for each (rank, stream), and the rings' and window's address and
// rkey. Once the group has formed, each rank takes the port of its local
// rank modulo its ports (so a host's ranks spread over its devices), moves
// its peers' QPs INIT→RTR→RTS, destroys the rest, and exchanges a hello on
// every QP: a MAC under the job's secret of group, epoch, ranks and stream.
//
// # Data
//
// Every message is an RDMA WRITE WITH IMM. A frame travels as chunks into
// the peer's receive ring for this (rank, stream), at most RingSlots chunks
// unconsumed (credits, returned in the immediates of the receiver's writes,
// or in an empty write once half the ring is free). Small frames are posted
// inline; a payload from a2a.AllocBuffer memory of at least ZCopyBytes is
// read by the device where it lies (the mapping registered on first use,
// deregistered when FreeBuffer releases it); the rest is copied into a
// pre-registered bounce pool. Go heap memory is never registered: the
// runtime may return its pages to the OS. One-sided LL stores
// (transport.Slots) are RDMA WRITEs WITH IMM into the peer's window.
//
// # Completions
//
// One completion queue per transport, polled without blocking by every
// TrySend, TryRecv and Load. Wait arms it, polls once more, and sleeps on an
// epoll set of the completion channel and a wake-up eventfd, which is also
// its PollFD for transport.Mixed. A peer whose QP fails (retries exceeded,
// flushed) or that says goodbye on Close is fault.ErrPeerLost.
package verbs
