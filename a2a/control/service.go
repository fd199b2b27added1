package control

import (
	"bytes"
	"cmp"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// maxPendingSeqs bounds the counts operations a formation keeps open at once,
// so a rank that keeps sending rows nobody matches cannot grow the service
// without bound.
const maxPendingSeqs = 1024

// Service is the coordinator: it forms rosters, assigns ranks, chooses epochs,
// aggregates counts rows into columns, and tracks heartbeats for status.
// NewService serves every group (as a2ad does); a member hosting an in-process
// coordinator uses one restricted to its own group.
type Service struct {
	nc   *nats.Conn
	log  *slog.Logger
	id   string // "svc-" + sid in base 36
	sid  uint64
	only string
	subs []*nats.Subscription

	sign    *signer
	rej     rejectCounter
	retried atomic.Uint64 // columns sent again for re-sent rows

	mu     sync.Mutex
	groups map[string]*group
	closed bool
	// joins counts the join handlers between their decision and the end
	// of its replies: Close waits for them, so that a roster formed before
	// Close reaches every member (see Close).
	joins sync.WaitGroup
	// beforeReply, when set (tests), runs before each reply a join handler
	// publishes, with its index.
	beforeReply func(i int)
	in          verifier // guarded by mu
	pruned      int      // len(in.seen) after the last pruning

	cc *codec // owned by the counts handler goroutine

	reports reportStore // the ranks' traffic reports (report.go)
}

// GroupView is a snapshot of one group's membership, for status displays.
type GroupView struct {
	Group   string
	Epoch   uint32 // 0 while forming
	Size    int    // WorldSize
	Forming bool
	Aborted bool
	// Ranks: formed groups list every rank in order; forming groups list the
	// joiners so far (Rank -1 for those awaiting assignment).
	Ranks []RankView
	// PendingCounts is the number of counts operations waiting for rows.
	PendingCounts int
}

// RankView is one member in a GroupView.
type RankView struct {
	Rank          int
	Host          string
	PID           int
	Transports    []string  // names of the data planes it offered, sorted
	LastHeartbeat time.Time // formed groups: last heartbeat (formation time before the first); forming: last join refresh
	Left          bool
	Lost          bool // silent longer than its PeerTimeout
}

type group struct {
	name      string
	lastEpoch uint32
	form      *formation
	// A failed roster leaves a tombstone for the joiners' PeerTimeout, so the
	// ranks of the same launch that arrive just after the failure get the
	// same error instead of waiting for their deadline.
	failKind   error
	failDetail string
	failUntil  time.Time
	// Joiners held while a formation that looks healthy still exists.
	waiting map[string]*waitingJoiner
}

type waitingJoiner struct {
	first, last time.Time
	timeout     time.Duration
}

type joiner struct {
	req     joinReq
	reply   string
	seen    time.Time
	arrival uint64
}

type rankState struct {
	info    NodeInfo
	id      string
	sender  uint64 // id parsed
	reply   string
	timeout time.Duration
	lastHB  time.Time
	left    bool
}

type formation struct {
	world, streams int
	joiners        map[string]*joiner
	arrivals       uint64

	epoch   uint32 // 0 while forming
	ranks   []*rankState
	byID    map[string]int
	aborted bool
	counts  map[uint64]*countsOp
	free    []*countsOp
	// done keeps the last keepDone completed ops, to answer a rank that
	// sends its row again because its column was lost; doneSeqs remembers
	// the seqs of the last keepDoneSeqs completed ops (doneSeqs[i] is the
	// seq+1, 0 empty), so a late copy of a row for an older one is dropped
	// instead of opening an op no one else will complete.
	done     map[uint64]*countsOp
	doneSeqs [keepDoneSeqs]uint64
	doneNext int
}

// keepDone is how many completed counts ops a formation keeps to answer
// re-sent rows: a rank waits for at most the ops it has in flight, and the
// others cannot complete many more without its rows. keepDoneSeqs is how many
// completed seqs it remembers beyond those.
const (
	keepDone     = 8
	keepDoneSeqs = 64
)

type countsOp struct {
	arrived int
	have    []bool
	want    []bool
	reply   []string
	mat     []byte // N*N little-endian int64, row-major
}

// outMsg is a reply to sign and publish: msg is built by sealed.
type outMsg struct {
	subj, group string
	epoch       uint32
	msg         []byte
}

// NewService starts a coordinator serving all groups on nc (wildcard
// subscriptions). Run one per NATS deployment. secret is the job secret of
// the groups it serves (JoinConfig.Secret; empty: the key derived from each
// group's name): it verifies and signs every message with it, and ignores
// (and counts, see Rejects) every message it cannot verify, so a group that
// runs with another secret is not served, and hosts its coordinator itself.
func NewService(nc *nats.Conn, secret []byte, logger *slog.Logger) (*Service, error) {
	return newService(nc, secret, logger, "")
}

func newService(nc *nats.Conn, secret []byte, logger *slog.Logger, only string) (*Service, error) {
	if nc == nil {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "control: nil NATS connection")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sid := rand.Uint64()
	log := logger.With("component", "a2a-control-service")
	s := &Service{
		nc:     nc,
		log:    log,
		rej:    rejectCounter{log: log},
		id:     "svc-" + strconv.FormatUint(sid, 36),
		sid:    sid,
		sign:   newSigner(sid, secret),
		in:     newVerifier(secret),
		only:   only,
		groups: make(map[string]*group),
		cc:     getCodec(),
	}
	tok := "*"
	if only != "" {
		tok = only
	}
	handlers := []struct {
		subj string
		h    nats.MsgHandler
	}{
		{svcPrefix + tok + "." + opPing, s.onPing},
		{svcPrefix + tok + "." + opClaim, s.onClaim},
		{svcPrefix + tok + "." + opJoin, s.onJoin},
		{svcPrefix + tok + "." + opCounts, s.onCounts},
		{subjPrefix + tok + ".*", s.onGroup},
	}
	if only == "" { // only a2ad's service keeps the live view's reports
		handlers = append(handlers, struct {
			subj string
			h    nats.MsgHandler
		}{svcPrefix + "*." + opReport, s.onReport})
	}
	for _, h := range handlers {
		sub, err := nc.Subscribe(h.subj, h.h)
		if err != nil {
			s.unsubscribe()
			return nil, fault.Wrap(fault.ErrInvalidArgument, -1, err, "control: subscribe %s", h.subj)
		}
		// Rows arrive in bursts of N and heartbeats from every member; the
		// default pending limits are ample but must not cut a burst.
		_ = sub.SetPendingLimits(-1, 64<<20)
		s.subs = append(s.subs, sub)
	}
	// Make the subscriptions effective at the server before anyone is told
	// this service exists.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		s.unsubscribe()
		return nil, fault.Wrap(fault.ErrTimeout, -1, err, "control: registering service subscriptions")
	}
	s.log.Debug("service started", "id", s.id, "group", cmp.Or(only, "*"))
	return s, nil
}

func (s *Service) unsubscribe() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// Close stops serving. Members of groups it served keep their membership but
// can no longer exchange counts or form new rosters through it.
//
// A join handler that decided before Close (a roster formed, say) finishes
// publishing its replies first: the member hosting the service may learn
// of the formation, fail and close in the time the handler takes to reply
// to the other members, and a roster that reached only some of its ranks
// leaves the others waiting for a formation that is gone until their
// deadline. The caller flushes the connection afterwards.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, sub := range subs {
		// Drain would wait for in-flight handlers; Unsubscribe is enough because
		// handlers check closed under the lock.
		_ = sub.Unsubscribe()
	}
	s.joins.Wait()
	s.log.Debug("service closed", "id", s.id)
	return nil
}

// Groups returns the current memberships sorted by group name. Formations whose
// ranks have all left or gone silent are dropped as a side effect.
func (s *Service) Groups() []GroupView {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []GroupView
	for _, g := range s.groups {
		f := g.form
		if f == nil {
			continue
		}
		if f.epoch == 0 {
			f.prune(now, "")
			if len(f.joiners) == 0 {
				g.form = nil
				continue
			}
			v := GroupView{Group: g.name, Size: f.world, Forming: true}
			for _, j := range f.joiners {
				v.Ranks = append(v.Ranks, RankView{Rank: j.req.Rank, Host: j.req.Info.Host, PID: j.req.Info.PID,
					Transports: transportNames(j.req.Info), LastHeartbeat: j.seen})
			}
			slices.SortFunc(v.Ranks, func(a, b RankView) int {
				return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Host, b.Host), cmp.Compare(a.PID, b.PID))
			})
			out = append(out, v)
			continue
		}
		gone := 0
		v := GroupView{Group: g.name, Epoch: f.epoch, Size: f.world, Aborted: f.aborted, PendingCounts: len(f.counts)}
		for r, st := range f.ranks {
			lost := now.Sub(st.lastHB) > st.timeout
			if st.left || lost {
				gone++
			}
			v.Ranks = append(v.Ranks, RankView{Rank: r, Host: st.info.Host, PID: st.info.PID,
				Transports: transportNames(st.info), LastHeartbeat: st.lastHB, Left: st.left, Lost: lost && !st.left})
		}
		if gone == len(f.ranks) {
			g.form = nil
			continue
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b GroupView) int { return cmp.Compare(a.Group, b.Group) })
	return out
}

// publish signs and sends replies. Messages that share a buffer are sealed
// one after the other, each right before it is sent.
func (s *Service) publish(out []outMsg) {
	for _, o := range out {
		if err := s.sign.publish(s.nc, o.subj, "", o.group, o.epoch, o.msg); err != nil {
			s.log.Warn("publish failed", "subject", o.subj, "err", err)
		}
	}
}

// ColumnsResent returns how many counts columns the service sent again
// because their rank re-sent its row (the first column was lost).
func (s *Service) ColumnsResent() uint64 { return s.retried.Load() }

// Rejects returns how many control messages the service refused to believe,
// by reason.
func (s *Service) Rejects() Rejects { return s.rej.snapshot() }

// reject counts a rejected message and logs the 1st, 2nd, 4th, 8th... one.
func (s *Service) reject(r RejectReason, subject string) { s.rej.add(r, subject) }

// open authenticates msg as a message of group and takes it unless it is a
// copy of one already taken. Called with s.mu held.
func (s *Service) open(msg *nats.Msg, group string) (envelope, []byte, bool) {
	env, p, why, ok := s.in.check(msg.Subject, group, msg.Data)
	if !ok {
		s.reject(why, msg.Subject)
		return env, nil, false
	}
	if len(s.in.seen) > 2*s.pruned+1024 {
		s.pruneSeen()
	}
	return env, p, true
}

// pruneSeen forgets the replay windows of senders that are neither joining
// nor members of a formation. Called with s.mu held.
func (s *Service) pruneSeen() {
	live := make(map[uint64]bool)
	for _, g := range s.groups {
		if f := g.form; f != nil {
			for _, st := range f.ranks {
				live[st.sender] = true
			}
			for id := range f.joiners {
				if sid, err := strconv.ParseUint(id, 36, 64); err == nil {
					live[sid] = true
				}
			}
		}
	}
	live[s.sid] = true
	s.in.seen.forget(func(sender uint64) bool { return live[sender] })
	s.pruned = len(s.in.seen)
}

// openRequest opens a request to the coordinator of the group its subject
// names, op being the subject's last token. When it reports ok it returns
// with s.mu held: the caller handles the request under the lock it was
// opened under, and unlocks.
func (s *Service) openRequest(msg *nats.Msg, op string) (name string, env envelope, p []byte, ok bool) {
	name = groupOfSvc(msg.Subject, op)
	if !validToken(name) {
		return "", env, nil, false
	}
	s.mu.Lock()
	if !s.closed {
		if env, p, ok = s.open(msg, name); ok {
			return name, env, p, true
		}
	}
	s.mu.Unlock()
	return "", env, nil, false
}

// answer replies v to a request of op (a ping, a claim) that asks for a
// reply and opens.
func (s *Service) answer(msg *nats.Msg, op string, v any) {
	if msg.Reply == "" {
		return
	}
	name, _, _, ok := s.openRequest(msg, op)
	if !ok {
		return
	}
	s.mu.Unlock()
	b, _ := msgpack.Marshal(v)
	s.publish([]outMsg{{msg.Reply, name, 0, sealed(b)}})
}

func (s *Service) onPing(msg *nats.Msg) { s.answer(msg, opPing, &pingMsg{ID: s.id}) }

func (s *Service) onClaim(msg *nats.Msg) { s.answer(msg, opClaim, &claimMsg{ID: s.id, Exists: true}) }

func (s *Service) onJoin(msg *nats.Msg) {
	now := time.Now()
	name, env, p, ok := s.openRequest(msg, opJoin)
	if !ok {
		return
	}
	var req joinReq
	if err := unmarshal(p, &req); err != nil || req.ID == "" {
		s.mu.Unlock()
		s.reject(RejectMalformed, msg.Subject)
		return
	}
	if req.ID != strconv.FormatUint(env.sender, 36) {
		s.mu.Unlock()
		s.reject(RejectSender, msg.Subject) // a join speaks for the member that signs it
		return
	}
	g := s.groups[name]
	if g == nil {
		g = &group{name: name, waiting: make(map[string]*waitingJoiner)}
		s.groups[name] = g
	}
	out := s.join(g, &req, msg.Reply, now)
	s.joins.Add(1) // under mu, not closed: Close waits for these replies
	hook := s.beforeReply
	s.mu.Unlock()
	for i := range out {
		if hook != nil {
			hook(i)
		}
		s.publish(out[i : i+1])
	}
	s.joins.Done()
}

func (s *Service) reply(g *group, subj string, r *joinResp) []outMsg {
	if subj == "" {
		return nil
	}
	r.Service = s.id
	b, err := msgpack.Marshal(r)
	if err != nil {
		s.log.Error("encoding join reply", "err", err)
		return nil
	}
	return []outMsg{{subj, g.name, r.Epoch, sealed(b)}}
}

func (s *Service) fail(g *group, subj string, kind error, detail string) []outMsg {
	return s.reply(g, subj, &joinResp{Status: stFail, Kind: kindCode(kind), Detail: detail})
}

// join handles one join, refresh or withdraw. Called with s.mu held.
func (s *Service) join(g *group, req *joinReq, reply string, now time.Time) []outMsg {
	if f := g.form; f != nil && f.epoch != 0 {
		if out, handled := s.joinFormed(g, f, req, reply, now); handled {
			return out
		}
		s.log.Info("dissolving formation", "group", g.name, "epoch", f.epoch)
		g.form = nil
	}
	delete(g.waiting, req.ID)
	f := g.form // forming, if not nil
	if req.Withdraw {
		if f != nil {
			delete(f.joiners, req.ID)
			if len(f.joiners) == 0 {
				g.form = nil
			}
		}
		return nil
	}
	if f != nil {
		f.prune(now, req.ID)
		if len(f.joiners) == 0 {
			f = nil
		}
	}
	if f == nil && now.Before(g.failUntil) {
		return s.fail(g, reply, g.failKind, g.failDetail)
	}
	if f == nil {
		f = &formation{world: req.World, streams: req.Streams, joiners: make(map[string]*joiner)}
		g.form = f
	}
	if kind, detail := f.conflict(req); kind != nil {
		return s.failRoster(g, f, req, reply, kind, detail, now)
	}
	j := f.joiners[req.ID]
	if j == nil {
		j = &joiner{arrival: f.arrivals}
		f.arrivals++
		f.joiners[req.ID] = j
	}
	j.req, j.reply, j.seen = *req, reply, now
	if len(f.joiners) == f.world {
		return s.complete(g, f, now)
	}
	return s.reply(g, reply, f.ack())
}

// joinFormed handles a join, refresh or withdraw while the group has a
// formed roster f. It reports false, with nothing to send, when f is dead:
// the caller dissolves it and goes on as if the group had none. Called with
// s.mu held.
func (s *Service) joinFormed(g *group, f *formation, req *joinReq, reply string, now time.Time) ([]outMsg, bool) {
	if r, ok := f.byID[req.ID]; ok {
		if req.Withdraw {
			return s.abortWithdrawn(g, f, r), true
		}
		// A refresh that crossed the formed reply, or a lost reply: resend.
		return s.formedReply(g, f, []string{reply}), true
	}
	if req.Withdraw {
		delete(g.waiting, req.ID)
		return nil, true
	}
	if f.dead(now) {
		return nil, false
	}
	return s.hold(g, f, req, reply, now), true
}

// abortWithdrawn tells the members of f that rank r gave up (its ctx
// expired) just as the roster completed: the others would only find out by
// heartbeat. Called with s.mu held.
func (s *Service) abortWithdrawn(g *group, f *formation, r int) []outMsg {
	if f.aborted {
		return nil
	}
	f.aborted = true
	b, _ := msgpack.Marshal(&abortMsg{Epoch: f.epoch, Origin: r, Kind: kindCode(fault.ErrTimeout), Rank: r,
		Detail: fmt.Sprintf("rank %d gave up joining as the roster completed", r)})
	return []outMsg{{groupSubject(g.name, opAbort), g.name, f.epoch, sealed(b)}}
}

// hold answers a joiner that is not a member of the healthy-looking
// formation f. The formation may be over without our knowing yet (leave and
// abort messages race this join; a killed rank takes PeerTimeout to
// notice): hold the joiner for two of its PeerTimeouts before calling it one
// member too many. Called with s.mu held.
func (s *Service) hold(g *group, f *formation, req *joinReq, reply string, now time.Time) []outMsg {
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	for id, w := range g.waiting {
		if now.Sub(w.last) > w.timeout {
			delete(g.waiting, id)
		}
	}
	w := g.waiting[req.ID]
	if w == nil {
		w = &waitingJoiner{first: now}
		g.waiting[req.ID] = w
	}
	w.last, w.timeout = now, timeout
	if now.Sub(w.first) < 2*timeout {
		return s.reply(g, reply, &joinResp{Status: stAck, World: f.world, Busy: f.epoch})
	}
	delete(g.waiting, req.ID)
	return s.fail(g, reply, fault.ErrInvalidArgument, fmt.Sprintf(
		"group %q is already formed with %d ranks (epoch %d): more members than WorldSize", g.name, f.world, f.epoch))
}

// failRoster fails every joiner of the forming roster f, the one whose
// request conflicts with it (req) last, and leaves a tombstone for the
// joiners' PeerTimeout. Called with s.mu held.
func (s *Service) failRoster(g *group, f *formation, req *joinReq, reply string, kind error, detail string, now time.Time) []outMsg {
	s.log.Warn("join rejected, failing the roster", "group", g.name, "detail", detail)
	var out []outMsg
	for id, j := range f.joiners {
		if id != req.ID {
			out = append(out, s.fail(g, j.reply, kind, detail)...)
		}
	}
	g.form = nil
	g.failKind, g.failDetail = kind, detail
	g.failUntil = now.Add(time.Duration(max(req.TimeoutMS, 100)) * time.Millisecond)
	return append(out, s.fail(g, reply, kind, detail)...)
}

// ack is the answer to a joiner of the forming roster f: the ranks present
// so far.
func (f *formation) ack() *joinResp {
	ack := &joinResp{Status: stAck, World: f.world}
	for _, o := range f.joiners {
		if o.req.Rank >= 0 {
			ack.Joined = append(ack.Joined, o.req.Rank)
		} else {
			ack.Unassigned++
		}
	}
	slices.Sort(ack.Joined)
	return ack
}

// prune drops pending joiners not refreshed within their PeerTimeout.
func (f *formation) prune(now time.Time, keep string) {
	for id, j := range f.joiners {
		if id != keep && now.Sub(j.seen) > time.Duration(j.req.TimeoutMS)*time.Millisecond {
			delete(f.joiners, id)
		}
	}
}

func (f *formation) conflict(req *joinReq) (error, string) {
	who := func(r *joinReq) string { return fmt.Sprintf("%s pid %d", r.Info.Host, r.Info.PID) }
	switch {
	case req.World != f.world:
		return fault.ErrInvalidArgument, fmt.Sprintf("WorldSize disagreement: %s asks %d, roster forming with %d",
			who(req), req.World, f.world)
	case req.Streams != f.streams:
		return fault.ErrInvalidArgument, fmt.Sprintf("Streams disagreement: %s asks %d, roster forming with %d",
			who(req), req.Streams, f.streams)
	case req.World < 1 || req.Rank < -1 || req.Rank >= req.World:
		return fault.ErrInvalidArgument, fmt.Sprintf("rank %d out of range for WorldSize %d (%s)", req.Rank, req.World, who(req))
	}
	others := 0
	for id, j := range f.joiners {
		if id == req.ID {
			continue
		}
		others++
		if req.Rank >= 0 && j.req.Rank == req.Rank {
			return fault.ErrInvalidArgument, fmt.Sprintf("duplicate rank %d: %s and %s", req.Rank, who(&j.req), who(req))
		}
	}
	if others+1 > f.world {
		return fault.ErrInvalidArgument, fmt.Sprintf("more members than WorldSize %d", f.world)
	}
	return nil, ""
}

func (f *formation) dead(now time.Time) bool {
	if f.aborted {
		return true
	}
	for _, r := range f.ranks {
		if r.left || now.Sub(r.lastHB) > r.timeout {
			return true
		}
	}
	return false
}

func (g *group) nextEpoch(now time.Time) uint32 {
	e := uint32(now.UnixMilli())
	if d := e - g.lastEpoch; d == 0 || d >= 1<<31 { // not after the last one (mod 2^32)
		e = g.lastEpoch + 1
	}
	if e == 0 {
		e = 1
	}
	g.lastEpoch = e
	return e
}

// complete assigns ranks and announces the formation. Called with s.mu held.
func (s *Service) complete(g *group, f *formation, now time.Time) []outMsg {
	f.ranks = make([]*rankState, f.world)
	f.byID = make(map[string]int, f.world)
	var assign []*joiner
	ids := make(map[*joiner]string, len(f.joiners))
	for id, j := range f.joiners {
		ids[j] = id
		if j.req.Rank >= 0 {
			f.place(j.req.Rank, id, j, now)
		} else {
			assign = append(assign, j)
		}
	}
	slices.SortFunc(assign, func(a, b *joiner) int {
		return cmp.Or(cmp.Compare(a.req.Info.Host, b.req.Info.Host), cmp.Compare(a.req.Info.PID, b.req.Info.PID),
			cmp.Compare(a.arrival, b.arrival))
	})
	r := 0
	for _, j := range assign {
		for f.ranks[r] != nil {
			r++
		}
		f.place(r, ids[j], j, now)
	}
	f.joiners = nil
	f.epoch = g.nextEpoch(now)
	f.counts = make(map[uint64]*countsOp)
	f.done = make(map[uint64]*countsOp)
	s.log.Info("group formed", "group", g.name, "epoch", f.epoch, "size", f.world)
	replies := make([]string, f.world)
	for i, st := range f.ranks {
		replies[i] = st.reply
	}
	return s.formedReply(g, f, replies)
}

func (f *formation) place(r int, id string, j *joiner, now time.Time) {
	info := j.req.Info
	info.Rank = r
	sender, _ := strconv.ParseUint(id, 36, 64) // the join's signer: checked in onJoin
	f.ranks[r] = &rankState{info: info, id: id, sender: sender, reply: j.reply, lastHB: now,
		timeout: time.Duration(j.req.TimeoutMS) * time.Millisecond}
	f.byID[id] = r
}

func (s *Service) formedReply(g *group, f *formation, to []string) []outMsg {
	resp := &joinResp{Status: stFormed, Service: s.id, Epoch: f.epoch, World: f.world,
		IDs: make([]string, f.world), Nodes: make([]NodeInfo, f.world)}
	for i, st := range f.ranks {
		resp.IDs[i], resp.Nodes[i] = st.id, st.info
	}
	b, err := msgpack.Marshal(resp)
	if err != nil {
		s.log.Error("encoding formed reply", "err", err)
		return nil
	}
	// One buffer for all: publish seals each copy right before sending it.
	msg := sealed(b)
	out := make([]outMsg, 0, len(to))
	for _, subj := range to {
		if subj != "" {
			out = append(out, outMsg{subj, g.name, f.epoch, msg})
		}
	}
	return out
}

// onGroup tracks heartbeats, aborts and leaves for status and for deciding
// when a formation is dead. Messages of groups it has no formation of are
// none of its business and are not even opened.
func (s *Service) onGroup(msg *nats.Msg) {
	name, op := splitGroupSubject(msg.Subject)
	if op != opHB && op != opAbort && op != opLeave {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[name]
	if s.closed || g == nil || g.form == nil || g.form.epoch == 0 {
		return
	}
	f := g.form
	env, p, ok := s.open(msg, name)
	if !ok {
		return
	}
	epoch, rank, err := decodeGroupMsg(op, p)
	switch {
	case err != nil || rank < 0 || rank >= len(f.ranks):
		s.reject(RejectMalformed, msg.Subject)
		return
	case env.epoch != f.epoch || epoch != f.epoch:
		s.reject(RejectEpoch, msg.Subject)
		return
	case f.ranks[rank].sender != env.sender && !(op == opAbort && env.sender == s.sid):
		s.reject(RejectSender, msg.Subject)
		return
	}
	switch op {
	case opHB:
		f.ranks[rank].lastHB = now
	case opAbort:
		f.aborted = true
	case opLeave:
		f.ranks[rank].left = true
		if f.allLeft() {
			s.log.Info("group left by every rank", "group", name, "epoch", f.epoch)
			g.form = nil
		}
	}
}

// allLeft reports whether every rank of the formed roster f left.
func (f *formation) allLeft() bool {
	for _, st := range f.ranks {
		if !st.left {
			return false
		}
	}
	return true
}

// decodeGroupMsg decodes a group message of op (a heartbeat, an abort, a
// leave) as far as the service needs it: the epoch and the rank it speaks
// for.
func decodeGroupMsg(op string, p []byte) (epoch uint32, rank int, err error) {
	switch op {
	case opHB:
		var m hbMsg
		err = unmarshal(p, &m)
		epoch, rank = m.Epoch, m.Rank
	case opAbort:
		var m abortMsg
		err = unmarshal(p, &m)
		epoch, rank = m.Epoch, m.Origin
	case opLeave:
		var m leaveMsg
		err = unmarshal(p, &m)
		epoch, rank = m.Epoch, m.Rank
	}
	return epoch, rank, err
}

// onCounts is the hot path: collect one row; when the seq is complete send
// every rank its column. It runs on one goroutine (one subscription), which
// owns s.cc.
func (s *Service) onCounts(msg *nats.Msg) {
	c := s.cc
	name, env, p, ok := s.openRequest(msg, opCounts)
	if !ok {
		return
	}
	rw, err := c.decodeRow(p)
	if err != nil {
		s.mu.Unlock()
		s.reject(RejectMalformed, msg.Subject)
		return
	}
	var f *formation
	if g := s.groups[name]; g != nil {
		f = g.form
	}
	var kind error
	var detail string
	switch {
	case f == nil || f.epoch == 0:
		kind, detail = fault.ErrAborted, fmt.Sprintf("group %q has no formed membership at this coordinator", name)
	case f.epoch != rw.epoch:
		kind, detail = fault.ErrAborted, fmt.Sprintf("membership epoch %d is no longer current (now %d)", rw.epoch, f.epoch)
	case rw.rank < 0 || rw.rank >= f.world || len(rw.counts) != f.world*8:
		kind, detail = fault.ErrInvalidArgument, fmt.Sprintf("bad counts row from rank %d (%d bytes)", rw.rank, len(rw.counts))
	case f.ranks[rw.rank].sender != env.sender:
		// Authentic but not from the rank it speaks for: the job's secret
		// leaked or a bug. Refuse the row, answer nothing.
		s.mu.Unlock()
		s.reject(RejectSender, msg.Subject)
		return
	}
	if kind == nil {
		for r, st := range f.ranks {
			if st.left {
				kind, detail = fault.ErrClosed, fmt.Sprintf("rank %d left the group", r)
				break
			}
		}
	}
	var op *countsOp
	if kind == nil {
		if d := f.done[rw.seq]; d != nil {
			// A re-sent row: its rank did not get its column.
			s.mu.Unlock()
			s.resendColumn(d, f.world, rw, msg.Reply, name)
			return
		}
		if f.completed(rw.seq) {
			s.mu.Unlock()
			return // a late copy of a row of a long completed op
		}
		op = f.counts[rw.seq]
		if op == nil {
			if len(f.counts) >= maxPendingSeqs {
				kind, detail = fault.ErrInvalidArgument, fmt.Sprintf("more than %d counts operations pending", maxPendingSeqs)
			} else {
				op = f.getOp()
				f.counts[rw.seq] = op
			}
		}
	}
	if kind != nil {
		s.mu.Unlock()
		if msg.Reply != "" {
			_ = s.sign.publish(s.nc, msg.Reply, "", name, rw.epoch, c.encodeColErr(rw.seq, rw.epoch, kind, -1, detail))
		}
		return
	}
	n := f.world
	if !op.have[rw.rank] {
		op.have[rw.rank] = true
		op.arrived++
	}
	copy(op.mat[rw.rank*n*8:], rw.counts)
	op.reply[rw.rank] = msg.Reply
	op.want[rw.rank] = rw.flags&rowWantMatrix != 0
	if op.arrived < n {
		s.mu.Unlock()
		return
	}
	delete(f.counts, rw.seq)
	epoch := f.epoch
	s.mu.Unlock()

	// The op is no longer reachable from the formation: send without the lock.
	s.sendColumns(op, n, name, rw.seq, epoch)

	s.mu.Lock()
	f.keep(rw.seq, op)
	s.mu.Unlock()
}

// resendColumn answers a re-sent row of a completed op d with the column
// (and the matrix, if the row asks) of its rank again. A row that differs
// from the one the op completed with is refused: a rank reused a seq.
func (s *Service) resendColumn(d *countsOp, n int, rw row, reply, group string) {
	if reply == "" {
		return
	}
	c := s.cc
	if !bytes.Equal(d.mat[rw.rank*n*8:(rw.rank+1)*n*8], rw.counts) {
		_ = s.sign.publish(s.nc, reply, "", group, rw.epoch, c.encodeColErr(rw.seq, rw.epoch, fault.ErrMismatch, rw.rank,
			fmt.Sprintf("rank %d sent other counts for seq %d than before", rw.rank, rw.seq)))
		return
	}
	s.retried.Add(1)
	s.sendColumn(d, n, rw.rank, reply, rw.flags&rowWantMatrix != 0, group, rw.seq, rw.epoch)
}

// keep files a completed op to answer re-sent rows, recycling the oldest.
// Called with s.mu held.
func (f *formation) keep(seq uint64, op *countsOp) {
	f.doneSeqs[f.doneNext] = seq + 1
	f.doneNext = (f.doneNext + 1) % keepDoneSeqs
	f.done[seq] = op
	// Only the last keepDone keep their matrices (keepDone < keepDoneSeqs).
	if evict := f.doneSeqs[(f.doneNext+keepDoneSeqs-keepDone-1)%keepDoneSeqs]; evict != 0 {
		if d := f.done[evict-1]; d != nil {
			delete(f.done, evict-1)
			f.putOp(d)
		}
	}
}

// completed reports whether seq is one of the last completed ops.
func (f *formation) completed(seq uint64) bool {
	return slices.Contains(f.doneSeqs[:], seq+1)
}

func (s *Service) sendColumns(op *countsOp, n int, group string, seq uint64, epoch uint32) {
	for j := 0; j < n; j++ {
		if op.reply[j] != "" {
			s.sendColumn(op, n, j, op.reply[j], op.want[j], group, seq, epoch)
		}
	}
}

// sendColumn sends rank j its column of op (and the whole matrix if want).
func (s *Service) sendColumn(op *countsOp, n, j int, reply string, want bool, group string, seq uint64, epoch uint32) {
	c := s.cc
	colBuf := c.scratch(n * 8)
	for i := 0; i < n; i++ {
		copy(colBuf[i*8:i*8+8], op.mat[(i*n+j)*8:])
	}
	var mat []byte
	if want {
		mat = op.mat
	}
	if err := s.sign.publish(s.nc, reply, "", group, epoch, c.encodeCol(seq, epoch, colBuf, mat)); err != nil {
		s.log.Warn("sending counts column", "rank", j, "err", err)
	}
}

func (f *formation) getOp() *countsOp {
	if k := len(f.free); k > 0 {
		op := f.free[k-1]
		f.free = f.free[:k-1]
		return op
	}
	n := f.world
	return &countsOp{have: make([]bool, n), want: make([]bool, n), reply: make([]string, n), mat: make([]byte, n*n*8)}
}

func (f *formation) putOp(op *countsOp) {
	op.arrived = 0
	clear(op.have)
	clear(op.want)
	clear(op.reply)
	if len(f.free) < 4 {
		f.free = append(f.free, op)
	}
}

// transportNames lists the data planes a rank offered, sorted.
func transportNames(n NodeInfo) []string {
	names := make([]string, 0, len(n.Transports))
	for name := range n.Transports {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
