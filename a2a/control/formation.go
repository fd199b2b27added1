package control

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// group is what the service keeps of one group: its roster, forming or
// formed, and what outlives a roster. Guarded by Service.mu.
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

// waitingJoiner is a joiner held while the group's formation looks
// healthy: first and last heard, and its PeerTimeout.
type waitingJoiner struct {
	first, last time.Time
	timeout     time.Duration
}

// joiner is a rank joining a forming roster: its latest request and reply
// subject, when it was last heard and its place in the order of arrival.
type joiner struct {
	req     joinReq
	reply   string
	seen    time.Time
	arrival uint64
}

// rankState is one rank of a formed roster.
type rankState struct {
	info    NodeInfo
	id      string
	sender  uint64 // id parsed
	reply   string
	timeout time.Duration
	lastHB  time.Time
	left    bool
}

// formation is a group's roster, forming (epoch 0: the joiners so far) or
// formed (the ranks, and the counts exchanged among them). Guarded by
// Service.mu.
type formation struct {
	world, streams int
	joiners        map[string]*joiner
	arrivals       uint64

	epoch   uint32 // 0 while forming
	ranks   []*rankState
	byID    map[string]int
	aborted bool
	counts  aggregation // made when formed
}

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
	f.counts = aggregation{pending: make(map[uint64]*countsOp), done: make(map[uint64]*countsOp)}
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
