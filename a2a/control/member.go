package control

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	neturl "net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Defaults for JoinConfig.
const (
	DefaultHeartbeatInterval = 250 * time.Millisecond
	DefaultPeerTimeout       = 1500 * time.Millisecond
)

// NodeInfo is what a rank publishes at join.
type NodeInfo struct {
	Rank    int    `msgpack:"r"` // requested rank, -1 = assign at join
	Host    string `msgpack:"h"` // host identity (grouping of ranks per host); default os.Hostname()
	PID     int    `msgpack:"p"` // default os.Getpid()
	Streams int    `msgpack:"s"` // connections per peer pair; equal on all ranks (0 means 1)
	CPUs    string `msgpack:"c"` // CPUs the rank may run on, as a kernel CPU list ("" unknown)
	// Machine names the kernel the rank runs on (its boot id; "" unknown):
	// ranks of several hosts (network namespaces, containers) on one
	// machine share its cores.
	Machine string `msgpack:"m"`
	// Transports holds the address of every data plane the rank offers, by
	// provider name ("tcp": host:port, "shm", "verbs": opaque to control).
	Transports map[string][]byte `msgpack:"t"`
}

// JoinConfig configures Join.
type JoinConfig struct {
	Group     string // a valid NATS subject token
	Rank      int    // -1: assigned at join; overrides Info.Rank
	WorldSize int    // >= 1
	Info      NodeInfo
	// HeartbeatInterval is the heartbeat period (default 250ms); join requests
	// are refreshed at the same period.
	HeartbeatInterval time.Duration
	// PeerTimeout: a rank silent this long is lost (default 1500ms); must
	// exceed HeartbeatInterval.
	PeerTimeout time.Duration
	// Secret signs and verifies every control message of the group (see the
	// package documentation): the job's secret, shared by every rank and by
	// the coordinator. Empty derives the key from the group name, which
	// catches corruption and replays but authenticates nothing.
	Secret []byte
	Logger *slog.Logger
}

// Member is one rank's membership in a formed group.
//
// Its state is grouped by concern, each group owning its lock:
//   - roster.mu is held while formFrom adopts the formation (rank, size,
//     epoch, nodes, roster, log and the per-rank slices of live and exit)
//     and stores roster.formed; it guards roster.early, so an abort heard
//     around the formed reply is either stashed or checked against the
//     roster, never lost. What formFrom sets is read-only afterwards.
//   - auth.mu guards auth.in; auth.sign and auth.rej lock themselves.
//   - live.rmu guards live.reconnected.
//   - counts.mu guards counts.waiters.
//   - exit.mu guards exit.err, exit.leaving and exit.leaveErr and the
//     closing of exit.done; exit.scope is stored under it.
//
// Everything else is atomic, fixed at Join, or owned by one goroutine.
type Member struct {
	nc    *nats.Conn
	log   *slog.Logger // gains the rank and epoch in formFrom
	cfg   JoinConfig
	id    string // join id: sid in base 36
	sid   uint64
	group string
	svc   *Service // coordinator hosted in-process, if any

	// The formation, set by formFrom under roster.mu.
	rank, size int
	epoch      uint32
	nodes      []NodeInfo
	roster     roster

	auth   memberAuth
	subj   memberSubjects // fixed at Join
	subs   subscriptions  // made by subscribe, ended by release
	live   liveness
	counts countsCalls
	exit   exitState
	// scopes are the open Scopes of this member's communicators made
	// without a rendezvous (OpenScope), by communicator id.
	scopes sync.Map
}

// roster is what a member knows of its formation's signers, and what waits
// for the formed reply to tell it.
type roster struct {
	mu sync.Mutex // guards early; held by formFrom while it stores formed
	// senders maps the formation's signers (join ids) to their ranks, and
	// coordinator is the signer of the formed reply; both are set before
	// formed.
	senders     map[uint64]int
	coordinator uint64
	formed      atomic.Bool
	early       []stashedAbort // aborts heard before the formed reply
}

// memberAuth signs what a member sends and checks what it receives.
type memberAuth struct {
	sign *signer
	mu   sync.Mutex // guards in
	in   verifier
	rej  rejectCounter // logs with the logger of Join: Member.log is replaced at formation
}

// memberSubjects are the subjects a member publishes to.
type memberSubjects struct {
	join, counts, hb, abort, leave string
}

// subscriptions are what a member receives on: the group's subjects, its
// join and counts inboxes, and the connection's status changes.
type subscriptions struct {
	groupSub              *nats.Subscription
	ctlInbox, countsInbox string
	ctlCh, countsCh       chan *nats.Msg
	ctlSub, countsSub     *nats.Subscription
	statusCh              chan nats.Status
	connCh                chan nats.Status // CONNECTED: a reconnect
}

// liveness is what the heartbeat loop watches and how it is stopped.
type liveness struct {
	start    time.Time
	lastSeen []atomic.Int64 // by rank: ns since start of its last heartbeat
	left     []atomic.Bool  // by rank: left the group, its silence is no loss

	// reconnected is closed (and replaced) whenever the connection comes
	// back after a disconnect, so waiting counts exchanges re-send at once.
	rmu         sync.Mutex
	reconnected chan struct{}

	stop chan struct{} // closed by LeaveAt to end the loop
	wg   sync.WaitGroup
}

// countsCalls are the counts exchanges in flight on a member.
type countsCalls struct {
	mu      sync.Mutex // guards waiters
	waiters map[uint64]*waiter
	resends atomic.Uint64 // counts rows sent again
}

// exitState is how the member ends and what stops its operations: its own
// abort or leave, and its peers' departures.
type exitState struct {
	mu       sync.Mutex    // guards err, leaving and leaveErr; done is closed and scope stored under it
	err      error         // the first abort's cause, or the leave's
	done     chan struct{} // closed when err is set
	leaving  bool
	leaveErr error

	// scope is the abort as FailedAt sees it: the cause and the first
	// operation it concerns (the earliest heard wins); departedFrom holds,
	// by rank, 1 + the first operation a departed rank takes no part in
	// (0 while present), minDeparted the least of them; changed wakes
	// waits when either moves.
	scope        atomic.Pointer[scopedErr]
	departedFrom []atomic.Uint64
	minDeparted  atomic.Uint64
	changed      notifier
}

// Join joins group cfg.Group through its coordinator (hosting one in-process if
// none answers, see the package documentation) and returns once the roster is
// complete. Members may share a nats.Conn (each holds its own subscriptions).
func Join(ctx context.Context, nc *nats.Conn, cfg JoinConfig) (*Member, error) {
	if err := normalize(nc, &cfg); err != nil {
		return nil, err
	}
	sid := rand.Uint64()
	m := &Member{
		nc:    nc,
		log:   cfg.Logger.With("group", cfg.Group),
		cfg:   cfg,
		id:    strconv.FormatUint(sid, 36),
		sid:   sid,
		group: cfg.Group,
		rank:  -1,
		auth: memberAuth{
			sign: newSigner(sid, cfg.Secret),
			in:   newVerifier(cfg.Secret),
			rej:  rejectCounter{log: cfg.Logger.With("group", cfg.Group)},
		},
		subj: memberSubjects{
			join:   svcSubject(cfg.Group, opJoin),
			counts: svcSubject(cfg.Group, opCounts),
			hb:     groupSubject(cfg.Group, opHB),
			abort:  groupSubject(cfg.Group, opAbort),
			leave:  groupSubject(cfg.Group, opLeave),
		},
		live: liveness{
			start:       time.Now(),
			reconnected: make(chan struct{}),
			stop:        make(chan struct{}),
		},
		counts: countsCalls{waiters: make(map[uint64]*waiter)},
		exit:   exitState{done: make(chan struct{})},
	}
	jctx, stopWatch := m.whileConnected(ctx)
	err := m.subscribe(jctx)
	if err != nil {
		stopWatch()
		m.release()
		return nil, m.joinError(ctx, jctx, err)
	}
	err = m.rendezvous(jctx)
	stopWatch()
	if err != nil {
		err = m.joinError(ctx, jctx, err)
		m.withdraw()
		m.release()
		if m.svc != nil {
			_ = m.svc.Close()
		}
		return nil, err
	}
	m.live.wg.Add(1)
	go m.heartbeat()
	m.log.Debug("joined", "rank", m.rank, "size", m.size, "epoch", m.epoch)
	return m, nil
}

func normalize(nc *nats.Conn, cfg *JoinConfig) error {
	bad := func(format string, args ...any) error {
		return fault.New(fault.ErrInvalidArgument, cfg.Rank, "control: "+format, args...)
	}
	switch {
	case nc == nil:
		return bad("nil NATS connection")
	case !validToken(cfg.Group):
		return bad("group %q is not a valid NATS subject token", cfg.Group)
	case cfg.WorldSize < 1:
		return bad("WorldSize %d < 1", cfg.WorldSize)
	case cfg.Rank < -1 || cfg.Rank >= cfg.WorldSize:
		return bad("rank %d out of range for WorldSize %d", cfg.Rank, cfg.WorldSize)
	case cfg.Info.Streams < 0:
		return bad("Streams %d < 0", cfg.Info.Streams)
	case cfg.HeartbeatInterval < 0 || cfg.PeerTimeout < 0:
		return bad("negative heartbeat interval or peer timeout")
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	if cfg.PeerTimeout <= cfg.HeartbeatInterval {
		return bad("PeerTimeout %v must exceed HeartbeatInterval %v", cfg.PeerTimeout, cfg.HeartbeatInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Info.Streams == 0 {
		cfg.Info.Streams = 1
	}
	if cfg.Info.Host == "" {
		cfg.Info.Host, _ = os.Hostname()
	}
	if cfg.Info.PID == 0 {
		cfg.Info.PID = os.Getpid()
	}
	cfg.Info.Rank = cfg.Rank
	return nil
}

func (m *Member) subscribe(ctx context.Context) error {
	base := m.nc.NewInbox()
	m.subs.ctlInbox, m.subs.countsInbox = base+".r", base+".c"
	m.subs.ctlCh = make(chan *nats.Msg, 64)
	// One reply per pending seq at most; the slack absorbs stale replies of
	// abandoned calls.
	m.subs.countsCh = make(chan *nats.Msg, 256)
	var err error
	wrap := func(err error, what string) error {
		kind := fault.ErrInvalidArgument // e.g. a permissions violation
		if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) {
			kind = fault.ErrClosed
		}
		return fault.Wrap(kind, -1, err, "control: subscribing %s", what)
	}
	// The group subscription exists before the join request so that an abort
	// published right after formation is not missed.
	if m.subs.groupSub, err = m.nc.Subscribe(groupSubject(m.group, "*"), m.onGroup); err != nil {
		return wrap(err, "group subjects")
	}
	_ = m.subs.groupSub.SetPendingLimits(-1, 64<<20)
	if m.subs.ctlSub, err = m.nc.ChanSubscribe(m.subs.ctlInbox, m.subs.ctlCh); err != nil {
		return wrap(err, "join inbox")
	}
	if m.subs.countsSub, err = m.nc.ChanSubscribe(m.subs.countsInbox, m.subs.countsCh); err != nil {
		return wrap(err, "counts inbox")
	}
	m.subs.statusCh = m.nc.StatusChanged(nats.CLOSED)
	m.subs.connCh = m.nc.StatusChanged(nats.CONNECTED)
	// A server refuses a subscription its user may not make asynchronously:
	// a round trip brings the refusal back, so a job given the wrong group's
	// credentials fails here instead of timing out.
	if err := flushSubscriptions(ctx, m.nc); err != nil {
		return err
	}
	err = m.nc.LastError()
	if errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
		// The server dropped a subscription over the account's limit, so
		// this member would never hear some of its replies.
		return fault.Wrap(fault.ErrResource, -1, err, "control: the NATS server refused a subscription over its limit "+
			"(a2ad serve gives each connection of a job --job-subs subscriptions per connection)")
	}
	if errors.Is(err, nats.ErrPermissionViolation) {
		for _, subj := range []string{m.subs.groupSub.Subject, m.subs.ctlInbox, m.subs.countsInbox} {
			if strings.Contains(err.Error(), `"`+subj+`"`) {
				return fault.Wrap(fault.ErrAuth, -1, err, "control: the NATS user may not subscribe to %s (its permissions must allow %v)",
					subj, Subjects(m.group))
			}
		}
	}
	return nil
}

func (m *Member) release() {
	for _, sub := range []*nats.Subscription{m.subs.groupSub, m.subs.ctlSub, m.subs.countsSub} {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}
	if m.subs.statusCh != nil {
		m.nc.RemoveStatusListener(m.subs.statusCh)
	}
	if m.subs.connCh != nil {
		m.nc.RemoveStatusListener(m.subs.connCh)
	}
}

// publish signs msg (built by sealed or the codec) and publishes it.
func (m *Member) publish(subj, reply string, epoch uint32, msg []byte) error {
	return m.auth.sign.publish(m.nc, subj, reply, m.group, epoch, msg)
}

// open authenticates msg as a message of this member's group and takes it
// unless it is a copy of one already taken. It counts what it rejects.
func (m *Member) open(msg *nats.Msg) (envelope, []byte, bool) {
	m.auth.mu.Lock()
	env, p, why, ok := m.auth.in.check(msg.Subject, m.group, msg.Data)
	m.auth.mu.Unlock()
	if !ok {
		m.reject(why, msg.Subject)
	}
	return env, p, ok
}

// reject counts a rejected message and logs the 1st, 2nd, 4th, 8th... one.
func (m *Member) reject(r RejectReason, subject string) { m.auth.rej.add(r, subject) }

// Rejects returns how many control messages this member refused to believe,
// by reason.
func (m *Member) Rejects() Rejects { return m.auth.rej.snapshot() }

// fromRank checks that an opened group message speaks for the rank its
// sender holds in the current formation.
func (m *Member) fromRank(env envelope, epoch uint32, rank int, subject string) bool {
	r, member := m.roster.senders[env.sender]
	switch {
	case env.epoch != m.epoch || epoch != m.epoch:
		m.reject(RejectEpoch, subject)
	case !member || r != rank:
		m.reject(RejectSender, subject)
	default:
		return true
	}
	return false
}

// isStatus reports whether msg is a status message of the server (such as
// "no responders"), which carries no data and no signature.
func isStatus(msg *nats.Msg) bool { return len(msg.Data) == 0 && msg.Header.Get("Status") != "" }

func (m *Member) ctxErr(ctx context.Context, format string, args ...any) error {
	return fault.Wrap(fault.ErrTimeout, -1, ctx.Err(), "control: "+format, args...)
}

// errConnClosed is a join whose NATS connection closed under it: the control
// plane is lost (nobody closed the communicator, so not ErrClosed).
var errConnClosed = fault.Wrap(fault.ErrAborted, -1, nats.ErrConnectionClosed, "control plane lost: the NATS connection closed during join")

// Rank returns this member's rank.
func (m *Member) Rank() int { return m.rank }

// Size returns the number of ranks in the group.
func (m *Member) Size() int { return m.size }

// Epoch returns the membership epoch, equal on all members and different for
// every formation of the group.
func (m *Member) Epoch() uint32 { return m.epoch }

// Nodes returns every rank's NodeInfo, indexed by rank. The slice is a copy;
// the byte and string slices inside are shared and must not be modified.
func (m *Member) Nodes() []NodeInfo { return slices.Clone(m.nodes) }

// Done is closed once the member is aborted (locally, by a peer, by a lost
// peer or a lost control plane) or has left.
func (m *Member) Done() <-chan struct{} { return m.exit.done }

// Err returns nil until Done is closed, then the cause: an error matching
// fault.ErrAborted (and the original kind, e.g. fault.ErrPeerLost) after an
// abort, or fault.ErrClosed after Leave.
func (m *Member) Err() error {
	m.exit.mu.Lock()
	defer m.exit.mu.Unlock()
	return m.exit.err
}

// onGroup takes the group's heartbeats, aborts and leaves.
func (m *Member) onGroup(msg *nats.Msg) {
	_, op := splitGroupSubject(msg.Subject)
	if op != opHB && op != opAbort && op != opLeave {
		return
	}
	if op != opAbort && !m.roster.formed.Load() {
		return // heartbeats and leaves of a roster this member is not part of yet
	}
	env, p, ok := m.open(msg)
	if !ok {
		return
	}
	switch op {
	case opHB:
		m.onHeartbeat(env, p, msg.Subject)
	case opAbort:
		m.onAbort(env, p, msg.Subject)
	case opLeave:
		m.onLeave(env, p, msg.Subject)
	}
}

// joinError is what a failed join reports: when the control plane went away
// under it (the connection closed, or down for PeerTimeout: whileConnected's
// cause), that, not what its loss broke on the way (a flush, a subscription).
func (m *Member) joinError(ctx, jctx context.Context, err error) error {
	if cause := context.Cause(jctx); ctx.Err() == nil && errors.Is(cause, fault.ErrAborted) {
		return cause
	}
	if m.nc.IsClosed() && ctx.Err() == nil {
		return errConnClosed
	}
	return err
}

// joinCheckEvery is how often a join looks at its NATS connection.
const joinCheckEvery = 100 * time.Millisecond

// whileConnected returns a context for the join that ends, with an ErrAborted
// "control plane lost" cause, once the NATS connection has been down for
// PeerTimeout. nats.go reconnects for ever, so without it a join would wait
// out its whole deadline for a server that is gone. stop ends the watch.
func (m *Member) whileConnected(ctx context.Context) (jctx context.Context, stop func()) {
	jctx, cancel := context.WithCancelCause(ctx)
	url := m.nc.ConnectedUrlRedacted()
	if u, err := neturl.Parse(m.nc.Opts.Url); url == "" && err == nil {
		url = u.Redacted() // down already: the URL it was given
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(joinCheckEvery)
		defer t.Stop()
		var downSince time.Time
		for {
			select {
			case <-done:
				return
			case <-jctx.Done():
				return
			case now := <-t.C:
				switch {
				case m.nc.Status() == nats.CONNECTED:
					downSince = time.Time{}
				case downSince.IsZero():
					downSince = now
				case now.Sub(downSince) > m.cfg.PeerTimeout:
					cancel(fault.Wrap(fault.ErrAborted, m.cfg.Rank, nats.ErrDisconnected,
						"control plane lost: disconnected from NATS %s for %v during join", url, now.Sub(downSince).Round(time.Millisecond)))
					return
				}
			}
		}
	}()
	return jctx, func() {
		close(done)
		<-exited
		cancel(nil)
	}
}
