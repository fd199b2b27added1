package a2a

import "github.com/a2a-moe/a2a/a2a/internal/fault"

// Error kinds. Every error a2a returns matches one of them with errors.Is; an
// error on one rank reaches the others as ErrAborted wrapping the original kind,
// so errors.Is(err, ErrPeerLost) holds on every survivor of a lost peer.
var (
	// ErrInvalidArgument: a call's arguments are wrong (counts, buffer sizes, ranks).
	ErrInvalidArgument = fault.ErrInvalidArgument
	// ErrMismatch: ranks disagree (different collectives, order, counts or roots).
	ErrMismatch = fault.ErrMismatch
	// ErrPeerLost: a peer process died, closed its connections or stopped heartbeating.
	ErrPeerLost = fault.ErrPeerLost
	// ErrAborted: the communicator was aborted, by this rank or another one.
	ErrAborted = fault.ErrAborted
	// ErrTimeout: an operation or the join did not complete before its deadline.
	ErrTimeout = fault.ErrTimeout
	// ErrClosed: the communicator was closed.
	ErrClosed = fault.ErrClosed
	// ErrAuth: the control plane refused this rank's credentials (NATS
	// user, token, nkey or creds file), or TLS could not verify the server
	// or was refused a client certificate. Join fails with it at once.
	ErrAuth = fault.ErrAuth
	// ErrResource: this rank ran out of a local resource (file descriptors,
	// /dev/shm space, locked memory, memory). The rank that ran out returns
	// it naming itself and the resource; its peers get ErrAborted wrapping
	// it. It is never reported as a peer's failure.
	ErrResource = fault.ErrResource
)

// Error is the concrete type behind the error kinds: Kind is one of the
// sentinels and Rank the rank concerned (-1 if none); when several are
// (the ranks a timed-out call was waiting for), Ranks lists them and Rank is
// the first.
type Error = fault.Error
