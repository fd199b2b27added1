package control

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

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
		if err := m.publish(m.subj.join, m.subs.ctlInbox, 0, req); err != nil {
			return fault.Wrap(fault.ErrClosed, -1, err, "control: sending join")
		}
	wait:
		for {
			select {
			case msg := <-m.subs.ctlCh:
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
				if err := m.publish(m.subj.join, m.subs.ctlInbox, 0, req); err != nil {
					return fault.Wrap(fault.ErrClosed, -1, err, "control: sending join")
				}
			case <-m.subs.statusCh:
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
		if n := m.auth.rej.snapshot()[RejectAuth]; n > 0 {
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
	senders := make(map[uint64]int, len(resp.IDs))
	for r, id := range resp.IDs {
		sid, err := strconv.ParseUint(id, 36, 64)
		if err != nil {
			return false
		}
		senders[sid] = r
	}
	m.roster.mu.Lock()
	m.rank, m.size, m.epoch, m.nodes = rank, len(resp.IDs), resp.Epoch, resp.Nodes
	m.roster.senders, m.roster.coordinator = senders, env.sender
	m.live.lastSeen = make([]atomic.Int64, m.size)
	m.live.left = make([]atomic.Bool, m.size)
	m.exit.departedFrom = make([]atomic.Uint64, m.size)
	now := int64(time.Since(m.live.start))
	for i := range m.live.lastSeen {
		m.live.lastSeen[i].Store(now)
	}
	m.log = m.log.With("rank", rank, "epoch", resp.Epoch)
	m.roster.formed.Store(true)
	early := m.roster.early
	m.roster.early = nil
	m.roster.mu.Unlock()
	// Join replies are over; a late duplicate must not sit in a channel.
	_ = m.subs.ctlSub.Unsubscribe()
	for i := range early {
		m.onAbortMsg(early[i].env, &early[i].a, early[i].subject)
	}
	return true
}

func (m *Member) joinReq(withdraw bool) []byte {
	b, _ := msgpack.Marshal(&joinReq{ID: m.id, Rank: m.cfg.Rank, World: m.cfg.WorldSize, Streams: m.cfg.Info.Streams,
		TimeoutMS: m.cfg.PeerTimeout.Milliseconds(), Withdraw: withdraw, Info: m.cfg.Info})
	return sealed(b)
}

func (m *Member) withdraw() {
	// A connection that is down would hold the flush for its whole timeout
	// and the withdrawal would not get through anyway.
	if m.nc.Status() == nats.CONNECTED {
		_ = m.publish(m.subj.join, "", 0, m.joinReq(true))
		_ = m.nc.FlushTimeout(time.Second)
	}
}
