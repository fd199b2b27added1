package control

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Discovery and election timing. The settle window only has to cover the
// round trip of claim replies (candidates learn of each other through those,
// not through arriving at the same time), so 200ms is generous even on a
// loaded machine.
const (
	pingTries      = 3
	pingTimeout    = 100 * time.Millisecond
	pingGap        = 25 * time.Millisecond
	settleWindow   = 200 * time.Millisecond
	claimRepublish = 50 * time.Millisecond
)

// discover returns once a coordinator for the group answers, or after this
// member started one.
func (m *Member) discover(ctx context.Context) error {
	if m.svc != nil {
		return nil
	}
	p, _ := msgpack.Marshal(&pingMsg{ID: m.id})
	ping := sealed(p)
	subj := svcSubject(m.group, opPing)
	// Replies come to an inbox of our own rather than through nats.Request,
	// which returns the first reply: a forged one must be skipped, and the
	// real one awaited.
	inbox := m.nc.NewInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := m.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return fault.Wrap(fault.ErrClosed, -1, err, "control: subscribing the ping inbox")
	}
	defer sub.Unsubscribe()
	tries := pingTries
	for {
		for i := 0; i < tries; i++ {
			found, none, err := m.ping(ctx, subj, inbox, ch, ping)
			switch {
			case found:
				return nil
			case ctx.Err() != nil:
				return m.ctxErr(ctx, "join of group %q (WorldSize %d) timed out: no coordinator found", m.group, m.cfg.WorldSize)
			case m.nc.IsClosed() || errors.Is(err, nats.ErrConnectionClosed):
				return errConnClosed
			}
			if none {
				if err := sleep(ctx, pingGap); err != nil {
					return m.ctxErr(ctx, "join of group %q timed out: no coordinator found", m.group)
				}
			}
		}
		if m.nc.Opts.NoEcho {
			continue // cannot host; wait for someone who can
		}
		won, release, err := m.elect(ctx)
		if err != nil {
			return err
		}
		if !won {
			// The winner decides within a settle window of its claim: give it
			// that long to answer before competing again.
			tries = 4 * pingTries
			continue
		}
		svc, err := newService(ctx, m.nc, ServiceConfig{Group: m.group, Secret: m.cfg.Secret, Logger: m.log}, false)
		release()
		if err != nil {
			return err
		}
		m.log.Info("hosting the group coordinator in-process")
		m.svc = svc
		return nil
	}
}

// ping asks once for a coordinator of the group and waits up to pingTimeout
// for an authentic answer. none reports that the server knows no subscriber
// of the ping subject.
func (m *Member) ping(ctx context.Context, subj, inbox string, ch chan *nats.Msg, ping []byte) (found, none bool, err error) {
	for len(ch) > 0 { // late answers to an earlier ping
		<-ch
	}
	if err := m.publish(subj, inbox, 0, ping); err != nil {
		return false, false, err
	}
	t := time.NewTimer(pingTimeout)
	defer t.Stop()
	for {
		select {
		case msg := <-ch:
			if isStatus(msg) {
				return false, msg.Header.Get("Status") == "503", nil
			}
			if _, p, ok := m.open(msg); ok {
				var pm pingMsg
				if unmarshal(p, &pm) == nil && pm.ID != "" {
					return true, false, nil
				}
				m.reject(RejectMalformed, msg.Subject)
			}
		case <-t.C:
			return false, false, nats.ErrTimeout
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type candState uint8

const (
	candidate candState = iota
	lost
	won
)

type election struct {
	m     *Member
	mu    sync.Mutex
	id    string
	nonce uint64
	state candState
	mine  []byte // our claim, also our answer to others' claims
	yes   []byte // "exists", our answer once we won
}

// less orders claims: smaller nonce wins, ties broken by id.
func less(n1 uint64, id1 string, n2 uint64, id2 string) bool {
	return n1 < n2 || (n1 == n2 && id1 < id2)
}

// claimOf opens a claim or an answer to one and checks that it speaks for
// its sender.
func (m *Member) claimOf(msg *nats.Msg) (c claimMsg, ok bool) {
	env, p, ok := m.open(msg)
	if !ok {
		return c, false
	}
	if unmarshal(p, &c) != nil {
		m.reject(RejectMalformed, msg.Subject)
		return c, false
	}
	if c.ID != strconv.FormatUint(env.sender, 36) && c.ID != "svc-"+strconv.FormatUint(env.sender, 36) {
		m.reject(RejectSender, msg.Subject)
		return c, false
	}
	return c, true
}

func (e *election) onClaim(msg *nats.Msg) {
	if isStatus(msg) {
		return
	}
	c, ok := e.m.claimOf(msg)
	if !ok || c.ID == e.id || c.Exists {
		return
	}
	e.mu.Lock()
	answer := e.mine
	switch e.state {
	case won:
		answer = e.yes
	case candidate:
		if less(c.Nonce, c.ID, e.nonce, e.id) {
			e.state = lost
		}
	}
	e.mu.Unlock()
	if msg.Reply != "" {
		_ = e.m.publish(msg.Reply, "", 0, sealed(answer))
	}
}

// elect runs one election round. If it returns won, the caller must start the
// service and then call release (until then this candidate answers claims
// with "exists").
func (m *Member) elect(ctx context.Context) (bool, func(), error) {
	nonce := rand.Uint64() >> 1
	if m.cfg.Rank != 0 {
		nonce |= 1 << 63
	}
	e := &election{m: m, id: m.id, nonce: nonce}
	e.mine, _ = msgpack.Marshal(&claimMsg{ID: m.id, Nonce: nonce})
	e.yes, _ = msgpack.Marshal(&claimMsg{ID: m.id, Exists: true})
	subj := svcSubject(m.group, opClaim)
	inbox := m.nc.NewInbox()
	ch := make(chan *nats.Msg, 256)
	rsub, err := m.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return false, nil, fault.Wrap(fault.ErrClosed, -1, err, "control: election")
	}
	defer rsub.Unsubscribe()
	// Subscribe before claiming: any candidate claiming after us then hears
	// our answer, which is what makes the outcome unique.
	csub, err := m.nc.Subscribe(subj, e.onClaim)
	if err != nil {
		return false, nil, fault.Wrap(fault.ErrClosed, -1, err, "control: election")
	}
	release := func() { _ = csub.Unsubscribe() }
	if err := m.publish(subj, inbox, 0, sealed(e.mine)); err != nil {
		release()
		return false, nil, fault.Wrap(fault.ErrClosed, -1, err, "control: election")
	}
	settle := time.NewTimer(settleWindow)
	defer settle.Stop()
	tick := time.NewTicker(claimRepublish)
	defer tick.Stop()
loop:
	for {
		select {
		case msg := <-ch:
			if isStatus(msg) {
				continue
			}
			c, ok := m.claimOf(msg)
			if !ok || c.ID == m.id {
				continue
			}
			e.mu.Lock()
			if c.Exists || less(c.Nonce, c.ID, e.nonce, e.id) {
				e.state = lost
			}
			e.mu.Unlock()
		case <-tick.C:
			e.mu.Lock()
			st := e.state
			e.mu.Unlock()
			if st == lost {
				break loop
			}
			_ = m.publish(subj, inbox, 0, sealed(e.mine))
		case <-settle.C:
			break loop
		case <-ctx.Done():
			release()
			return false, nil, m.ctxErr(ctx, "join of group %q timed out electing a coordinator", m.group)
		}
	}
	e.mu.Lock()
	if e.state == candidate {
		e.state = won
	}
	st := e.state
	e.mu.Unlock()
	if st != won {
		release()
		m.log.Debug("lost coordinator election")
		return false, nil, nil
	}
	m.log.Debug("won coordinator election", "nonce", nonce)
	return true, release, nil
}
