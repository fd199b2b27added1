package control

import (
	"cmp"
	"slices"
	"time"
)

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
		v := GroupView{Group: g.name, Epoch: f.epoch, Size: f.world, Aborted: f.aborted, PendingCounts: len(f.counts.pending)}
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

// transportNames lists the data planes a rank offered, sorted.
func transportNames(n NodeInfo) []string {
	names := make([]string, 0, len(n.Transports))
	for name := range n.Transports {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
