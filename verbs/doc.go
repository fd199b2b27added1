// Package verbs will implement the transport interfaces (a2a/transport) over
// RDMA verbs with cgo and libibverbs, behind a build tag, for machines that
// have RDMA hardware (or Soft-RoCE). See docs/ARCHITECTURE.md for how its
// queue pairs map to streams and RDMA WRITE to window puts.
package verbs
