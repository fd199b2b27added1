// Package control is the NATS control plane of a2a: membership (join, rank
// assignment, peer addresses), heartbeats, graceful leave, abort propagation and
// the counts exchange that precedes every AllToAllV. Payload bytes never travel
// over NATS; only small msgpack control messages do. Only core NATS
// publish/subscribe/request is used (no JetStream), so any NATS server or
// cluster works, not only the one embedded in a2ad.
//
// # Coordinator
//
// Rendezvous and counts aggregation go through a coordinator, a [Service]. The
// a2ad daemon runs one serving every group (NewService). When no daemon answers,
// the joining ranks host one in-process for their own group: Join pings for a
// service (three tries); if none answers, the ranks that still have no service
// run an election. Each candidate subscribes to the group's claim subject and
// publishes a claim carrying a random nonce (an explicit Rank 0 uses a nonce
// with the top bit clear, so it wins whenever it takes part); every candidate
// answers every claim with its own nonce and a running service answers with
// "exists". After a settle window (200ms, claims republished every 50ms) a
// candidate that saw neither a smaller nonce nor a service starts the service
// and, from the moment it decides, answers further claims with "exists".
// Because a candidate subscribes before it claims, of two overlapping
// candidates at least one sees the other's nonce, so exactly one wins (the
// republishing covers the delay with which a NATS cluster propagates a new
// subscription between servers); losers
// return to pinging and join the winner's service. The hosting member stops
// the service when it leaves. Run at most one a2ad service per NATS
// deployment, and start it before the job: a daemon started while an
// in-process service is already serving a group would serve it twice.
// A connection with NoEcho set never hosts (it would not receive its own rows).
//
// # Subjects
//
// For a group G (a single NATS subject token):
//
//	a2a.svc.G.ping    request: is a service serving G? reply {id}
//	a2a.svc.G.claim   election claim {id, nonce}; replies {nonce} or {exists}
//	a2a.svc.G.join    join request (also refresh and withdraw) -> replies on the
//	                  joiner's inbox: ack (roster so far), formed, or fail
//	a2a.svc.G.counts  one counts row per rank per operation, reply subject is
//	                  the member's persistent counts inbox
//	a2a.svc.G.report  one rank's traffic summary for a2ad's live view, at most
//	                  one per second per rank and none while idle (report.go)
//	a2a.G.hb          heartbeats [epoch, rank]
//	a2a.G.abort       abort [epoch, origin rank, kind, concerned rank, detail]
//	a2a.G.leave       graceful leave [epoch, rank]
//
// Service subjects have four tokens and group subjects three, so a group named
// "svc" does not collide with the service namespace. Replies to a member go to
// two subscriptions it holds for its whole life: <inbox>.r (join replies) and
// <inbox>.c (counts columns), where <inbox> comes from nats.Conn.NewInbox and so
// honours a custom inbox prefix.
//
// # Integrity
//
// Every message is signed with the job secret (JoinConfig.Secret; NewService's
// secret) in an envelope carrying the sender's id, the epoch and the sender's
// sequence number, the MAC covering subject and group too (see seal.go).
// Receivers refuse and count (Member.Rejects, Service.Rejects) what fails the
// MAC, repeats a sequence number, is of another epoch or speaks for a rank
// its signer does not hold; requests keep waiting for an authentic reply. A
// coordinator ignores the groups it cannot verify, which then host their
// own. Connections of package a2a use the inbox prefix InboxPrefix(G), so a
// NATS user allowed only Subjects(G) can run group G and reach no other.
//
// # Membership
//
// The service keeps, per group, one roster that is either forming or formed.
// Joiners refresh their request every HeartbeatInterval; a pending joiner not
// heard from for its PeerTimeout is dropped, so a rank that crashed while
// joining does not block a restarted one. The roster completes when WorldSize
// joiners are present. Ranks given explicitly keep their rank; joiners that
// asked for assignment (Rank -1) receive the free ranks in ascending order,
// sorted by (Host, PID, arrival) so that the ranks of one host are contiguous.
// A disagreement (WorldSize, Streams, duplicate rank, rank out of range) fails
// every pending joiner with fault.ErrInvalidArgument: a misconfigured launch
// fails fast everywhere instead of leaving some ranks to time out (ranks of
// the same launch arriving within a PeerTimeout after the failure get the same
// error). A formation that is aborted, has a left rank or a rank silent for its
// PeerTimeout is dissolved by the next join, which starts a new formation. A
// join for a group whose formation looks healthy is held for two of the
// joiner's PeerTimeouts, because leave and abort messages race the join and a
// killed rank takes PeerTimeout to be noticed (so a restarted rank rejoins);
// if the formation is still healthy then, the join fails with
// ErrInvalidArgument (more members than WorldSize). The membership epoch is taken from the service clock
// in milliseconds (truncated to 32 bits, never 0) and is strictly increasing per
// group within one service, so every formation of a group gets a new epoch.
//
// # Failure detection
//
// Every member publishes a heartbeat per HeartbeatInterval and checks, on the
// same tick, every other member's last heartbeat; one silent for PeerTimeout is
// declared lost: the member aborts with an error matching both fault.ErrAborted
// and fault.ErrPeerLost and publishes the abort. A member aborted from its
// first operation stops heartbeating, so a peer that missed the abort message
// still detects it as lost. One aborted from a later operation (AbortAt past
// the operation it runs) keeps heartbeating and watching until its abort
// covers everything: its earlier operations must still complete, or fail
// when a peer they wait for is lost. A member whose NATS connection closes, or stays disconnected for
// PeerTimeout, aborts itself. Leave publishes a leave message; the others stop
// watching that rank and do not treat its silence as a loss.
//
// # NATS node loss
//
// Core NATS delivers at most once: when a server of a cluster dies, the
// messages in flight through it are lost, and for a moment after a client
// reconnects to another server its subscriptions have not reached the rest
// of the cluster. The connection (nats.go, with the server list it was given
// and the servers the cluster advertises) reconnects on its own; a member
// whose connection comes back restarts every peer's silence at that moment
// (it heard nothing while away) and heartbeats at once. A PeerTimeout
// longer than the reconnect (tens of milliseconds when a server process
// dies) therefore declares no healthy peer lost. Heartbeats and join
// requests are periodic, so a lost one costs nothing; what cannot be lost
// is the counts exchange, see below.
//
// # Counts exchange
//
// Each rank publishes its row (little-endian int64 bytes in a msgpack bin) to
// the service, which keeps rows per (epoch, seq), including rows for a seq
// other ranks have not reached yet, and once all rows of a seq are present
// sends each rank its column (and the whole matrix to ranks that asked) and
// releases the seq. That is 2N messages per operation through the server.
// A rank that has no column yet sends its row again, signed anew, at once
// when its connection reconnects and otherwise after a HeartbeatInterval,
// then after pauses doubling to four of them. The service takes a row for a
// pending seq idempotently (one per rank) and answers a row for one of the
// last eight completed seqs with that rank's column again (a row that
// differs from the first is refused with ErrMismatch: the seq was reused);
// late copies for older seqs are dropped. So a row or a column lost with a
// NATS server costs the exchange one retry pause, not its deadline.
package control
