package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

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
type Member struct {
	nc    *nats.Conn
	log   *slog.Logger
	cfg   JoinConfig
	id    string // join id: sid in base 36
	sid   uint64
	group string

	sign *signer
	vmu  sync.Mutex // guards in
	in   verifier
	rej  rejectCounter // logs with the logger of Join: log is replaced at formation
	// roster maps the senders of the formation to their ranks, svcSender is
	// the coordinator that formed it; both are set before formed.
	roster    map[uint64]int
	svcSender uint64

	rank, size int
	epoch      uint32
	nodes      []NodeInfo

	subjJoin, subjCounts, subjHB, subjAbort, subjLeave string
	ctlInbox, countsInbox                              string
	ctlCh, countsCh                                    chan *nats.Msg
	ctlSub, countsSub, groupSub                        *nats.Subscription
	statusCh                                           chan nats.Status
	connCh                                             chan nats.Status // CONNECTED: a reconnect
	svc                                                *Service         // coordinator hosted in-process, if any

	// reconnected is closed (and replaced) whenever the connection comes
	// back after a disconnect, so waiting counts exchanges re-send at once.
	rmu         sync.Mutex
	reconnected chan struct{}

	start    time.Time
	lastSeen []atomic.Int64 // ns since start
	left     []atomic.Bool
	formed   atomic.Bool
	stashMu  sync.Mutex
	stash    []stashedAbort // aborts heard before the formed reply

	wmu     sync.Mutex
	waiters map[uint64]*waiter
	resends atomic.Uint64 // counts rows sent again

	// scope is the abort as FailedAt sees it: the cause and the first
	// operation it concerns (the earliest heard wins); departedFrom holds,
	// by rank, 1 + the first operation a departed rank takes no part in
	// (0 while present), minDeparted the least of them; changed wakes
	// waits when either moves.
	scope        atomic.Pointer[scopedErr]
	departedFrom []atomic.Uint64
	minDeparted  atomic.Uint64
	changed      notifier

	mu       sync.Mutex
	err      error
	done     chan struct{}
	leaveErr error
	leaving  bool
	stop     chan struct{}
	wg       sync.WaitGroup
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
		nc:      nc,
		log:     cfg.Logger.With("group", cfg.Group),
		cfg:     cfg,
		id:      strconv.FormatUint(sid, 36),
		sid:     sid,
		rej:     rejectCounter{log: cfg.Logger.With("group", cfg.Group)},
		sign:    newSigner(sid, cfg.Secret),
		in:      newVerifier(cfg.Secret),
		group:   cfg.Group,
		rank:    -1,
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
		start:   time.Now(),
		waiters: make(map[uint64]*waiter),

		reconnected: make(chan struct{}),
	}
	m.subjJoin = svcSubject(m.group, opJoin)
	m.subjCounts = svcSubject(m.group, opCounts)
	m.subjHB = groupSubject(m.group, opHB)
	m.subjAbort = groupSubject(m.group, opAbort)
	m.subjLeave = groupSubject(m.group, opLeave)
	if err := m.subscribe(); err != nil {
		m.release()
		return nil, err
	}
	if err := m.rendezvous(ctx); err != nil {
		m.withdraw()
		m.release()
		if m.svc != nil {
			_ = m.svc.Close()
		}
		return nil, err
	}
	m.wg.Add(1)
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

func (m *Member) subscribe() error {
	base := m.nc.NewInbox()
	m.ctlInbox, m.countsInbox = base+".r", base+".c"
	m.ctlCh = make(chan *nats.Msg, 64)
	// One reply per pending seq at most; the slack absorbs stale replies of
	// abandoned calls.
	m.countsCh = make(chan *nats.Msg, 256)
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
	if m.groupSub, err = m.nc.Subscribe(groupSubject(m.group, "*"), m.onGroup); err != nil {
		return wrap(err, "group subjects")
	}
	_ = m.groupSub.SetPendingLimits(-1, 64<<20)
	if m.ctlSub, err = m.nc.ChanSubscribe(m.ctlInbox, m.ctlCh); err != nil {
		return wrap(err, "join inbox")
	}
	if m.countsSub, err = m.nc.ChanSubscribe(m.countsInbox, m.countsCh); err != nil {
		return wrap(err, "counts inbox")
	}
	m.statusCh = m.nc.StatusChanged(nats.CLOSED)
	m.connCh = m.nc.StatusChanged(nats.CONNECTED)
	// A server refuses a subscription its user may not make asynchronously:
	// a round trip brings the refusal back, so a job given the wrong group's
	// credentials fails here instead of timing out.
	if err := m.nc.FlushTimeout(5 * time.Second); err != nil {
		return wrap(err, "group subjects")
	}
	if err := m.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		for _, subj := range []string{m.groupSub.Subject, m.ctlInbox, m.countsInbox} {
			if strings.Contains(err.Error(), `"`+subj+`"`) {
				return fault.Wrap(fault.ErrAuth, -1, err, "control: the NATS user may not subscribe to %s (its permissions must allow %v)",
					subj, Subjects(m.group))
			}
		}
	}
	return nil
}

func (m *Member) release() {
	for _, sub := range []*nats.Subscription{m.groupSub, m.ctlSub, m.countsSub} {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}
	if m.statusCh != nil {
		m.nc.RemoveStatusListener(m.statusCh)
	}
	if m.connCh != nil {
		m.nc.RemoveStatusListener(m.connCh)
	}
}

// reconnects returns a channel closed at the next reconnect of the NATS
// connection.
func (m *Member) reconnects() <-chan struct{} {
	m.rmu.Lock()
	defer m.rmu.Unlock()
	return m.reconnected
}

// onReconnect runs when the connection is back after a disconnect (the
// server it was on died, say, and nats.go moved to another server of the
// cluster; the subscriptions are already re-sent). While it was away this
// member heard no heartbeats, so every peer's silence restarts now instead
// of counting the reconnect window against healthy peers; a heartbeat goes
// out at once so peers do the same for us; and waiting counts exchanges
// re-send their rows (messages in flight through the dead server are lost:
// core NATS is at-most-once).
func (m *Member) onReconnect(hb []byte) {
	m.log.Info("control plane reconnected", "server", m.nc.ConnectedUrlRedacted())
	m.restartSilence()
	_ = m.publish(m.subjHB, "", m.epoch, hb)
	m.rmu.Lock()
	close(m.reconnected)
	m.reconnected = make(chan struct{})
	m.rmu.Unlock()
}

// restartSilence counts every peer's silence from now: after a reconnect,
// or a stall of this member's own heartbeat loop, when peers' heartbeats
// may not have reached it for reasons of its own.
func (m *Member) restartSilence() {
	now := int64(time.Since(m.start))
	for r := range m.lastSeen {
		for {
			old := m.lastSeen[r].Load()
			if old >= now || m.lastSeen[r].CompareAndSwap(old, now) {
				break
			}
		}
	}
}

// stalled says whether a heartbeat tick that came gap after the previous
// one shows this process starved (descheduled, a long GC pause, a machine
// with more runnable threads than cores): more than half a peer timeout
// late. Peers' heartbeats may then sit unread in this process's buffers,
// and their silence is not theirs.
func stalled(gap, interval, peerTimeout time.Duration) bool {
	return gap > interval+peerTimeout/2
}

func (m *Member) joinReq(withdraw bool) []byte {
	b, _ := msgpack.Marshal(&joinReq{ID: m.id, Rank: m.cfg.Rank, World: m.cfg.WorldSize, Streams: m.cfg.Info.Streams,
		TimeoutMS: m.cfg.PeerTimeout.Milliseconds(), Withdraw: withdraw, Info: m.cfg.Info})
	return sealed(b)
}

func (m *Member) withdraw() {
	if !m.nc.IsClosed() {
		_ = m.publish(m.subjJoin, "", 0, m.joinReq(true))
		_ = m.nc.FlushTimeout(time.Second)
	}
}

// publish signs msg (built by sealed or the codec) and publishes it.
func (m *Member) publish(subj, reply string, epoch uint32, msg []byte) error {
	return m.sign.publish(m.nc, subj, reply, m.group, epoch, msg)
}

// open authenticates msg as a message of this member's group and takes it
// unless it is a copy of one already taken. It counts what it rejects.
func (m *Member) open(msg *nats.Msg) (envelope, []byte, bool) {
	m.vmu.Lock()
	env, p, why, ok := m.in.check(msg.Subject, m.group, msg.Data)
	m.vmu.Unlock()
	if !ok {
		m.reject(why, msg.Subject)
	}
	return env, p, ok
}

// reject counts a rejected message and logs the 1st, 2nd, 4th, 8th... one.
func (m *Member) reject(r RejectReason, subject string) { m.rej.add(r, subject) }

// Rejects returns how many control messages this member refused to believe,
// by reason.
func (m *Member) Rejects() Rejects { return m.rej.snapshot() }

// fromRank checks that an opened group message speaks for the rank its
// sender holds in the current formation.
func (m *Member) fromRank(env envelope, epoch uint32, rank int, subject string) bool {
	r, member := m.roster[env.sender]
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

var errConnClosed = fault.Wrap(fault.ErrClosed, -1, nats.ErrConnectionClosed, "control: NATS connection closed")

// rendezvous finds (or hosts) the coordinator and waits for the roster.
func (m *Member) rendezvous(ctx context.Context) error {
	refresh := m.cfg.HeartbeatInterval
	var ack *joinResp
	t := time.NewTicker(refresh)
	defer t.Stop()
	for {
		if err := m.discover(ctx); err != nil {
			return err
		}
		lastAck := time.Now()
		req := m.joinReq(false)
		if err := m.publish(m.subjJoin, m.ctlInbox, 0, req); err != nil {
			return fault.Wrap(fault.ErrClosed, -1, err, "control: sending join")
		}
	wait:
		for {
			select {
			case msg := <-m.ctlCh:
				env, p, ok := m.open(msg)
				if !ok {
					continue
				}
				var resp joinResp
				if unmarshal(p, &resp) != nil {
					m.reject(RejectMalformed, msg.Subject)
					continue
				}
				switch resp.Status {
				case stAck:
					ack, lastAck = &resp, time.Now()
				case stFail:
					return &fault.Error{Kind: kindOfCode(resp.Kind), Rank: m.cfg.Rank,
						Detail: fmt.Sprintf("control: join of group %q refused: %s", m.group, resp.Detail)}
				case stFormed:
					if m.formFrom(env, &resp) {
						return nil
					}
				}
			case <-t.C:
				if m.svc == nil && time.Since(lastAck) > 4*refresh {
					m.log.Info("coordinator stopped answering join refreshes, looking for another")
					break wait
				}
				if err := m.publish(m.subjJoin, m.ctlInbox, 0, req); err != nil {
					return fault.Wrap(fault.ErrClosed, -1, err, "control: sending join")
				}
			case <-m.statusCh:
				return errConnClosed
			case <-ctx.Done():
				return m.joinTimeout(ctx, ack)
			}
		}
	}
}

func (m *Member) joinTimeout(ctx context.Context, ack *joinResp) error {
	if ack == nil {
		hint := ""
		if n := m.rej.snapshot()[RejectAuth]; n > 0 {
			hint = fmt.Sprintf(" (%d control messages failed authentication: do all ranks and the coordinator share the job secret?)", n)
		}
		return m.ctxErr(ctx, "join of group %q (WorldSize %d) timed out: no coordinator acknowledged the join%s",
			m.group, m.cfg.WorldSize, hint)
	}
	if ack.Busy != 0 {
		return m.ctxErr(ctx, "join of group %q (WorldSize %d) timed out: the group is still formed (epoch %d) by other members",
			m.group, m.cfg.WorldSize, ack.Busy)
	}
	var missing []int
	for r := 0; r < m.cfg.WorldSize; r++ {
		if !slices.Contains(ack.Joined, r) {
			missing = append(missing, r)
		}
	}
	return m.ctxErr(ctx, "join of group %q (WorldSize %d) timed out: ranks joined %v, %d awaiting assignment, ranks missing %v",
		m.group, m.cfg.WorldSize, ack.Joined, ack.Unassigned, missing)
}

// formFrom adopts a formed roster, signed by its coordinator (env), if it
// includes this member.
func (m *Member) formFrom(env envelope, resp *joinResp) bool {
	rank := slices.Index(resp.IDs, m.id)
	if rank < 0 || len(resp.Nodes) != len(resp.IDs) || resp.Epoch == 0 || env.epoch != resp.Epoch {
		return false
	}
	roster := make(map[uint64]int, len(resp.IDs))
	for r, id := range resp.IDs {
		sid, err := strconv.ParseUint(id, 36, 64)
		if err != nil {
			return false
		}
		roster[sid] = r
	}
	m.stashMu.Lock()
	m.rank, m.size, m.epoch, m.nodes = rank, len(resp.IDs), resp.Epoch, resp.Nodes
	m.roster, m.svcSender = roster, env.sender
	m.lastSeen = make([]atomic.Int64, m.size)
	m.left = make([]atomic.Bool, m.size)
	m.departedFrom = make([]atomic.Uint64, m.size)
	now := int64(time.Since(m.start))
	for i := range m.lastSeen {
		m.lastSeen[i].Store(now)
	}
	m.log = m.log.With("rank", rank, "epoch", resp.Epoch)
	m.formed.Store(true)
	stash := m.stash
	m.stash = nil
	m.stashMu.Unlock()
	// Join replies are over; a late duplicate must not sit in a channel.
	_ = m.ctlSub.Unsubscribe()
	for i := range stash {
		m.onAbortMsg(stash[i].env, &stash[i].a, stash[i].subject)
	}
	return true
}

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
func (m *Member) Done() <-chan struct{} { return m.done }

// Err returns nil until Done is closed, then the cause: an error matching
// fault.ErrAborted (and the original kind, e.g. fault.ErrPeerLost) after an
// abort, or fault.ErrClosed after Leave.
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Abort aborts the member locally and tells the group (AbortAt(0, cause):
// every operation). Peers see an error matching fault.ErrAborted that wraps
// cause's kind.
func (m *Member) Abort(cause error) { m.AbortAt(0, cause) }

// AbortAt aborts the member from operation from on, locally and on every
// peer: FailedAt reports the abort for operations numbered from or later,
// while earlier ones, which the aborting rank had finished or left behind,
// go on. Operation numbers are the caller's (the Comm's op sequence); 0
// concerns all. Done closes at the first abort, and Err keeps its cause; a
// later abort with an earlier from narrows the scope and is told again.
func (m *Member) AbortAt(from uint64, cause error) {
	var err error
	switch {
	case cause == nil:
		err = fault.New(fault.ErrAborted, m.rank, "aborted by the application")
	case errors.Is(cause, fault.ErrAborted):
		err = cause
	default:
		err = fault.Wrap(fault.ErrAborted, m.rank, cause, "aborted locally")
	}
	m.abortAt(from, err, true)
}

// scopedErr is an abort and the first operation it concerns.
type scopedErr struct {
	err  error
	from uint64
}

// abort records err as the cause of an abort of every operation.
func (m *Member) abort(err error, publish bool) { m.abortAt(0, err, publish) }

// abortAt records err as the cause from operation from on (the earliest
// scope wins) and optionally publishes it.
func (m *Member) abortAt(from uint64, err error, publish bool) {
	m.mu.Lock()
	if s := m.scope.Load(); s != nil && s.from <= from {
		m.mu.Unlock()
		return
	}
	m.scope.Store(&scopedErr{err: err, from: from})
	first := m.err == nil
	if first {
		m.err = err
		close(m.done)
	}
	m.mu.Unlock()
	m.changed.notify()
	if first {
		m.log.Log(context.Background(), fault.LogLevel(err), "member aborted", "err", err, "from", from)
	}
	if publish && !m.nc.IsClosed() {
		kind, rank, detail := describe(err)
		b, _ := msgpack.Marshal(&abortMsg{Epoch: m.epoch, Origin: m.rank, Kind: kindCode(kind), Rank: rank, Detail: detail, From: from})
		if perr := m.publish(m.subjAbort, "", m.epoch, sealed(b)); perr != nil {
			m.log.Warn("publishing abort", "err", perr)
		}
	}
}

// stashedAbort is an authentic abort heard before the formed reply; whether
// its sender is a member is checked once the roster is known.
type stashedAbort struct {
	env     envelope
	a       abortMsg
	subject string
}

func (m *Member) onGroup(msg *nats.Msg) {
	_, op := splitGroupSubject(msg.Subject)
	if op != opHB && op != opAbort && op != opLeave {
		return
	}
	if op != opAbort && !m.formed.Load() {
		return // heartbeats and leaves of a roster this member is not part of yet
	}
	env, p, ok := m.open(msg)
	if !ok {
		return
	}
	switch op {
	case opHB:
		var hb hbMsg
		if unmarshal(p, &hb) != nil || hb.Rank < 0 || hb.Rank >= m.size {
			m.reject(RejectMalformed, msg.Subject)
			return
		}
		if m.fromRank(env, hb.Epoch, hb.Rank, msg.Subject) {
			m.lastSeen[hb.Rank].Store(int64(time.Since(m.start)))
		}
	case opAbort:
		var a abortMsg
		if unmarshal(p, &a) != nil {
			m.reject(RejectMalformed, msg.Subject)
			return
		}
		m.stashMu.Lock()
		if !m.formed.Load() {
			if len(m.stash) < 16 {
				m.stash = append(m.stash, stashedAbort{env, a, msg.Subject})
			}
			m.stashMu.Unlock()
			return
		}
		m.stashMu.Unlock()
		m.onAbortMsg(env, &a, msg.Subject)
	case opLeave:
		var l leaveMsg
		if unmarshal(p, &l) != nil || l.Rank < 0 || l.Rank >= m.size {
			m.reject(RejectMalformed, msg.Subject)
			return
		}
		if m.fromRank(env, l.Epoch, l.Rank, msg.Subject) {
			m.depart(l.Rank, l.From)
		}
	}
}

// onAbortMsg aborts this member for an authentic abort of its formation from
// the rank it names, or from the coordinator (which aborts for a rank that
// gave up joining).
func (m *Member) onAbortMsg(env envelope, a *abortMsg, subject string) {
	if a.Epoch != m.epoch || env.epoch != m.epoch {
		m.reject(RejectEpoch, subject)
		return
	}
	if env.sender == m.sid {
		return // our own
	}
	if r, member := m.roster[env.sender]; (!member || r != a.Origin) && env.sender != m.svcSender {
		m.reject(RejectSender, subject)
		return
	}
	if a.Origin == m.rank {
		return
	}
	m.abortAt(a.From, &fault.Error{Kind: fault.ErrAborted, Rank: a.Origin, Detail: fmt.Sprintf("aborted by rank %d", a.Origin),
		Err: &fault.Error{Kind: kindOfCode(a.Kind), Rank: a.Rank, Detail: a.Detail}}, false)
}

// depart records that rank left the group, taking no part in operations
// from from on, and wakes the waits that may need it.
func (m *Member) depart(rank int, from uint64) {
	m.left[rank].Store(true)
	if !m.departedFrom[rank].CompareAndSwap(0, from+1) {
		return
	}
	for {
		cur := m.minDeparted.Load()
		if cur != 0 && cur <= from+1 {
			break
		}
		if m.minDeparted.CompareAndSwap(cur, from+1) {
			break
		}
	}
	m.changed.notify()
}

// FailedAt reports why operation seq (the caller's numbering, as given to
// AbortAt and LeaveAt) cannot complete: an abort whose scope covers it, this
// member having left, or a rank that left the group before taking part in
// it (an error matching fault.ErrPeerLost naming that rank). It returns nil
// otherwise, even after an abort of later operations.
func (m *Member) FailedAt(seq uint64) error {
	if s := m.scope.Load(); s != nil && seq >= s.from {
		return s.err
	}
	if d := m.minDeparted.Load(); d != 0 && seq+1 >= d {
		for r := range m.departedFrom {
			if f := m.departedFrom[r].Load(); f != 0 && seq+1 >= f {
				return m.departedErr(r)
			}
		}
	}
	return nil
}

// Departed reports, as an error matching fault.ErrPeerLost, that rank left
// the group; nil while it is a member.
func (m *Member) Departed(rank int) error {
	if rank >= 0 && rank < len(m.departedFrom) && m.departedFrom[rank].Load() != 0 {
		return m.departedErr(rank)
	}
	return nil
}

func (m *Member) departedErr(rank int) error {
	return fault.New(fault.ErrPeerLost, rank, "rank %d left group %q", rank, m.group)
}

// Changed returns a channel closed at the next change of what FailedAt or
// Departed report: take it before looking, then wait on it.
func (m *Member) Changed() <-chan struct{} { return m.changed.wait() }

// notifier wakes every goroutine waiting for the next event.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
	n.mu.Unlock()
}

// heartbeat publishes heartbeats and watches peers and the connection. It
// stops when the member aborts (so peers that missed the abort message see it
// go silent) or leaves.
func (m *Member) heartbeat() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.HeartbeatInterval)
	defer t.Stop()
	p, _ := msgpack.Marshal(&hbMsg{Epoch: m.epoch, Rank: m.rank})
	hb := sealed(p) // sealed anew (sequence number, MAC) for every beat
	_ = m.publish(m.subjHB, "", m.epoch, hb)
	var downSince time.Time
	lastTick := time.Now()
	for {
		select {
		case <-m.stop:
			return
		case <-m.done:
			return
		case <-m.statusCh:
			if m.abortIfClosed() {
				return
			}
		case <-m.connCh:
			if m.nc.Status() == nats.CONNECTED {
				downSince = time.Time{}
				m.onReconnect(hb)
			}
		case <-t.C:
			// The time of receipt, not the tick's: a starved loop receives
			// a tick sent on time long after.
			tick := time.Now()
			gap := tick.Sub(lastTick)
			lastTick = tick
			if m.abortIfClosed() {
				return
			}
			if m.nc.Status() != nats.CONNECTED {
				if downSince.IsZero() {
					downSince = time.Now()
				} else if time.Since(downSince) > m.cfg.PeerTimeout {
					m.abort(fault.Wrap(fault.ErrAborted, m.rank, nats.ErrDisconnected,
						"control plane lost: disconnected from NATS for %v", time.Since(downSince).Round(time.Millisecond)), false)
					return
				}
				continue
			}
			downSince = time.Time{}
			_ = m.publish(m.subjHB, "", m.epoch, hb)
			if stalled(gap, m.cfg.HeartbeatInterval, m.cfg.PeerTimeout) {
				m.log.Debug("heartbeat loop stalled: peers' silence restarts", "gap", gap)
				m.restartSilence()
				continue
			}
			if m.abortIfPeerLost() {
				return
			}
		}
	}
}

// abortIfClosed aborts the member when its NATS connection is closed, and
// reports whether it did. The abort is not published: it could not be.
func (m *Member) abortIfClosed() bool {
	if !m.nc.IsClosed() {
		return false
	}
	m.abort(fault.Wrap(fault.ErrAborted, m.rank, nats.ErrConnectionClosed, "control plane lost"), false)
	return true
}

// abortIfPeerLost aborts the member, and tells the group, when a peer that
// has not left has been silent for longer than PeerTimeout, and reports
// whether it did.
func (m *Member) abortIfPeerLost() bool {
	timeout := int64(m.cfg.PeerTimeout)
	now := int64(time.Since(m.start))
	for r := range m.lastSeen {
		if r == m.rank || m.left[r].Load() {
			continue
		}
		if silent := now - m.lastSeen[r].Load(); silent > timeout {
			lost := fault.New(fault.ErrPeerLost, r, "no heartbeat for %v", time.Duration(silent).Round(time.Millisecond))
			m.abort(&fault.Error{Kind: fault.ErrAborted, Rank: r, Detail: fmt.Sprintf("rank %d lost", r), Err: lost}, true)
			return true
		}
	}
	return false
}

// Leave leaves the group gracefully (LeaveAt(0): this rank takes part in
// no operation any peer still waits for).
func (m *Member) Leave() error { return m.LeaveAt(0) }

// LeaveAt leaves the group gracefully: it publishes a leave (peers stop
// watching this rank, and their FailedAt reports it lost for operations
// numbered from or later, the first this rank did not finish), stops
// heartbeats, releases subscriptions and stops the coordinator this member
// hosts, if any. Done is closed afterwards and Err reports fault.ErrClosed
// unless the member had aborted. Leave is idempotent.
func (m *Member) LeaveAt(from uint64) error {
	m.mu.Lock()
	if m.leaving {
		m.mu.Unlock()
		return m.leaveErr
	}
	m.leaving = true
	m.mu.Unlock()
	var err error
	if !m.nc.IsClosed() {
		b, _ := msgpack.Marshal(&leaveMsg{Epoch: m.epoch, Rank: m.rank, From: from})
		if perr := m.publish(m.subjLeave, "", m.epoch, sealed(b)); perr != nil {
			err = fault.Wrap(fault.ErrClosed, m.rank, perr, "control: publishing leave")
		}
	}
	close(m.stop)
	m.wg.Wait()
	m.release()
	if m.svc != nil {
		// Before the flush: Close lets the coordinator finish the replies
		// it was sending (a roster it formed must reach every member).
		_ = m.svc.Close()
	}
	if !m.nc.IsClosed() {
		// Make sure the leave (and any replies or columns our coordinator
		// published) left this process before the caller closes the
		// connection.
		_ = m.nc.FlushTimeout(time.Second)
	}
	m.mu.Lock()
	if m.err == nil {
		m.err = fault.New(fault.ErrClosed, m.rank, "left group %q", m.group)
		m.scope.Store(&scopedErr{err: m.err})
		close(m.done)
	}
	m.leaveErr = err
	m.mu.Unlock()
	m.changed.notify()
	m.log.Debug("left")
	return err
}
