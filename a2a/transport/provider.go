package transport

import (
	"context"
	"log/slog"
)

// A Provider is one kind of data plane (tcp, shm, verbs), as Gloo's
// transport::Device is: it prepares this rank's endpoint before the group
// forms, the endpoint's address travels opaque through the control plane's
// rendezvous, and once the group has formed the endpoint connects the peers
// the communicator assigns to it into a Transport. A communicator composes
// the Transports of several providers into one (NewMixed).
//
// Adding a data plane is one package that implements Provider plus one entry
// in the communicator's provider list; nothing else names it: the layers
// above read what they need of it from its Capabilities.
type Provider interface {
	// Name names the provider and its link class: "shm", "verbs", "tcp".
	// It is the key of the provider's address in the rendezvous, the value
	// of A2A_TRANSPORT that forces it, and the link table's class.
	Name() string
	// Capabilities says what the provider's links offer. It depends on the
	// provider's settings only, so every rank configured alike sees the
	// same.
	Capabilities() Capabilities
	// Listen prepares this rank's endpoint. It fails when the provider
	// cannot serve on this machine (no device, no library, no permission),
	// with an error that says why.
	Listen(ctx context.Context, self Self) (Endpoint, error)
}

// Self is what a provider knows of this rank before the group forms.
type Self struct {
	Group   string // job name, a valid NATS subject token
	Rank    int    // this rank, or -1 until the rendezvous assigns it
	Size    int    // world size
	Host    string // host identity (a2a.HostIdentity); equal on ranks of one host
	Streams int    // ordered streams per peer pair
	Secret  []byte // the job's secret, for providers that authenticate peers
	Logger  *slog.Logger
}

// Peer is one rank of the formed group as the rendezvous announced it.
type Peer struct {
	Rank int
	Host string // host identity
	PID  int
	// Address is the provider's address bytes the rank announced, nil
	// when it announced none (the provider is unavailable there or was not
	// allowed by its settings).
	Address []byte
}

// Group is the formed group as one provider sees it.
type Group struct {
	Rank  int    // this rank
	Size  int    // world size
	Epoch uint32 // membership epoch: connections of another epoch are refused
	Peers []Peer // every rank, by rank, with this provider's addresses
}

// An Endpoint is one rank's prepared side of a provider.
type Endpoint interface {
	// Address is what peers need to reach this rank: the rendezvous carries
	// it to every rank as Peer.Address. Never nil.
	Address() []byte
	// Reaches returns nil when this rank (self) and peer can talk through
	// the provider, or an error saying why not. Both ends of a pair decide
	// from what both announced, so they always agree.
	Reaches(self, peer Peer) error
	// Connect links this rank with the ranks in peers (never itself) once
	// the group g has formed, and returns the Transport that reaches them;
	// the Transport then owns the endpoint. Every rank of peers connects
	// back to this rank through the same provider at the same time.
	Connect(ctx context.Context, g Group, peers []int) (Transport, error)
	// Close releases an endpoint whose Connect was never called or failed.
	Close() error
}

// Poller is implemented by transports whose readiness a file descriptor
// shows (an epoll set, a completion channel): the descriptor becomes
// readable when Wait would return. A composed transport parks on the
// descriptors of all such parts at once instead of taking turns.
type Poller interface {
	PollFD() int
}

// PeerSlots is implemented by transports composed of parts: SlotsOf
// returns the part's one-sided window that reaches peer, or nil, so that a
// caller storing to and polling one peer skips the routing hop.
type PeerSlots interface {
	SlotsOf(peer int) Slots
}

// Capabilities are what a provider's links offer. The cost model, the LL
// protocol and the MoE dispatcher read them instead of comparing provider
// names.
type Capabilities struct {
	// Cost is the built-in price of one of its links, used where nothing
	// was measured (a2ad tune, A2A_LINKS=probe).
	Cost Cost
	// MappedCost is the built-in price of a message a peer copies from its
	// mapping of the sender's registered buffer (the mapped-copy link
	// class); zero when its links never map registered buffers.
	MappedCost Cost
	// SlotBytes is the payload of one LL slot of the one-sided window its
	// transports open to a peer (Slots, watched by SlotWatcher); 0 when it
	// has none and LL messages travel as frames.
	SlotBytes int
	// PackedSlots: its LL slots take the packed form (EncodePacked), so an
	// LL message moves about its payload, where the word form moves twice
	// it: the LL policy sends larger collectives one-sided over it.
	PackedSlots bool
	// MapsMemory: the ranks it links share a host and may map each other's
	// memory, so a layer above may move bytes between them through mapped
	// segments of its own instead of through the transport.
	MapsMemory bool
	// StreamDescriptors and PeerDescriptors are the file descriptors a link
	// to one peer holds open: per stream (a socket each) and per peer (a
	// pidfd), so Join can check the rank's descriptor limit up front.
	StreamDescriptors, PeerDescriptors int
}

// Cost is the alpha-beta price of a link: a message costs Alpha seconds
// plus Beta seconds per byte, and Lanes messages may move at once at full
// rate (the cost model's algo.Link).
type Cost struct {
	Alpha, Beta float64
	Lanes       int
}
