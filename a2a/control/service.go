package control

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Service is the coordinator: it forms rosters, assigns ranks, chooses epochs,
// aggregates counts rows into columns, and tracks heartbeats for status.
// NewService serves every group (as a2ad does); a member hosting an in-process
// coordinator uses one restricted to its own group.
type Service struct {
	nc   *nats.Conn
	log  *slog.Logger
	id   string // "svc-" + sid in base 36
	sid  uint64
	only string // the one group served, "" for all

	sign    *signer       // locks itself
	rej     rejectCounter // atomic
	retried atomic.Uint64 // columns sent again for re-sent rows

	// mu guards subs (once newService returns), groups, closed, in, pruned
	// and beforeReply, and orders joins.Add before Close's wait.
	mu     sync.Mutex
	subs   []*nats.Subscription
	groups map[string]*group
	closed bool
	in     verifier
	pruned int // len(in.seen) after the last pruning
	// joins counts the join handlers between their decision and the end
	// of its replies: Close waits for them, so that a roster formed before
	// Close reaches every member (see Close).
	joins sync.WaitGroup
	// beforeReply, when set (tests), runs before each reply a join handler
	// publishes, with its index.
	beforeReply func(i int)

	cc *codec // owned by the counts handler goroutine

	rate *bucket // nil: no rate limit

	reports reportStore // the ranks' traffic reports (report.go), under its own lock
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
	return StartService(context.Background(), nc, ServiceConfig{Secret: secret, Logger: logger})
}

// ServiceConfig says what a Service coordinates and how much it takes in.
type ServiceConfig struct {
	// Group is the one group served; "" serves every group.
	Group string
	// Secret is the job secret of the groups served (see NewService).
	Secret []byte
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// MaxRate caps the messages per second the service handles (a burst
	// of one second's worth passes): beyond it a message is dropped before
	// its MAC is even checked and counted as RejectRate. A job that floods
	// its coordinator then costs it one comparison per message, and a
	// service per job (a2ad serve's tenants, each on a connection of its
	// own) keeps the flood from the others. 0: no limit.
	MaxRate float64
}

// StartService starts a coordinator as cfg says on nc: for every group or
// one, keeping the live view's traffic reports (Traffic) either way. ctx
// bounds the flush that makes its subscriptions effective.
func StartService(ctx context.Context, nc *nats.Conn, cfg ServiceConfig) (*Service, error) {
	return newService(ctx, nc, cfg, true)
}

// newService starts a coordinator for group only, or for every group, and
// keeps the ranks' traffic reports when reports is set. ctx bounds the flush
// that makes its subscriptions effective.
func newService(ctx context.Context, nc *nats.Conn, cfg ServiceConfig, reports bool) (*Service, error) {
	secret, logger, only := cfg.Secret, cfg.Logger, cfg.Group
	if nc == nil {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "control: nil NATS connection")
	}
	if only != "" && !validToken(only) {
		return nil, fault.New(fault.ErrInvalidArgument, -1, "control: group %q is not one NATS subject token", only)
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
	if cfg.MaxRate > 0 {
		s.rate = newBucket(cfg.MaxRate, time.Now())
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
	if reports { // only a2ad's services keep the live view's reports
		handlers = append(handlers, struct {
			subj string
			h    nats.MsgHandler
		}{svcPrefix + tok + "." + opReport, s.onReport})
	}
	for _, h := range handlers {
		sub, err := nc.Subscribe(h.subj, s.limited(h.h))
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
	if err := flushSubscriptions(ctx, nc); err != nil {
		s.unsubscribe()
		return nil, err
	}
	s.log.Debug("service started", "id", s.id, "group", cmp.Or(only, "*"))
	return s, nil
}

// flushSubscriptions waits until the server has the connection's
// subscriptions, at most 5 s or until ctx ends. A disconnect in the middle
// fails the flush although nats.go re-sends the subscriptions once it is
// back, so it flushes again then; a connection that closed is the control
// plane lost.
func flushSubscriptions(ctx context.Context, nc *nats.Conn) error {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		err := nc.FlushWithContext(fctx)
		switch {
		case err == nil:
			return nil
		case nc.IsClosed():
			return errConnClosed
		case fctx.Err() != nil:
			return fault.Wrap(fault.ErrTimeout, -1, err, "control: registering service subscriptions")
		}
		if sleep(fctx, 50*time.Millisecond) != nil {
			return fault.Wrap(fault.ErrTimeout, -1, err, "control: registering service subscriptions")
		}
	}
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

// publish signs and sends replies. Messages that share a buffer are sealed
// one after the other, each right before it is sent.
func (s *Service) publish(out []outMsg) {
	for _, o := range out {
		if err := s.sign.publish(s.nc, o.subj, "", o.group, o.epoch, o.msg); err != nil {
			s.log.Warn("publish failed", "subject", o.subj, "err", err)
		}
	}
}

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
