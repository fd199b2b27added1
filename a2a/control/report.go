package control

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Traffic reports feed the live view of a2ad serve (/ui/): every rank
// publishes, at most once per period and only while its figures change, a
// summary of what it exchanged with each peer on a2a.svc.G.report. Only a
// daemon-style service (NewService, StartService) subscribes, so the subject costs a group
// that runs its own coordinator nothing but the server's discarding of the
// messages. The figures are cumulative since the member joined, so a lost
// message costs resolution, not correctness.

const opReport = "report"

// Bounds on what a report may carry, so a malformed or hostile one cannot
// grow the service: operation names are short and few.
const (
	maxReportOps     = 256
	maxReportNameLen = 32
)

// Report is one rank's traffic summary (Member.Report).
type Report struct {
	// Seq numbers the member's reports from 1; a gap tells the service that
	// one was lost.
	Seq uint64
	// Period is how often the rank looks at its figures; the service treats
	// a rank unheard of for several periods as idle.
	Period time.Duration
	// Elapsed is when the figures were read and Since the time the rank read
	// them before, both since it joined (rank clock). A rank publishes only
	// when its figures changed since its last report, so everything between
	// that report and Since was idle.
	Elapsed, Since time.Duration
	// Sent[j] is the bytes the rank's transport sent rank j (frame headers
	// included; zero for the rank itself).
	Sent []uint64
	// Wait[j] is the time the rank's operations waited for rank j: for each
	// operation in which rank j's data arrived last, the time until it did.
	// Last[j] counts those operations.
	Wait []time.Duration
	Last []uint64
	// Ops counts the rank's operations by name and algorithm, Errors the
	// failed ones.
	Ops    []OpCount
	Errors uint64
	// MoE, if set, is what the rank's MoE layers did (reportmoe.go).
	MoE *MoEReport
}

// OpCount is how many operations of one name ran one algorithm.
type OpCount struct {
	Op, Algo string
	Count    uint64
}

type reportMsg struct {
	_msgpack struct{} `msgpack:",as_array"`
	Epoch    uint32
	Rank     int
	Seq      uint64
	PeriodNS int64
	Elapsed  int64
	Since    int64
	Sent     []uint64
	WaitNS   []int64
	Last     []uint64
	Ops      []opCountMsg
	Errors   uint64
	MoE      *moeMsg
}

type opCountMsg struct {
	_msgpack struct{} `msgpack:",as_array"`
	Op, Algo string
	Count    uint64
}

// Report publishes r, this rank's traffic summary, to the control-plane
// service (a2ad serve shows it at /ui/). Sent, Wait and Last must have one
// entry per rank. It does not wait for anyone: reports are best effort.
func (m *Member) Report(r *Report) error {
	n := m.size
	if len(r.Sent) != n || len(r.Wait) != n || len(r.Last) != n {
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: report of %d/%d/%d entries for %d ranks",
			len(r.Sent), len(r.Wait), len(r.Last), n)
	}
	if len(r.Ops) > maxReportOps {
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: report of %d operation kinds (at most %d)", len(r.Ops), maxReportOps)
	}
	msg := reportMsg{Epoch: m.epoch, Rank: m.rank, Seq: r.Seq, PeriodNS: int64(r.Period), Elapsed: int64(r.Elapsed),
		Since: int64(r.Since), Sent: r.Sent, WaitNS: make([]int64, n), Last: r.Last, Errors: r.Errors}
	for j, w := range r.Wait {
		msg.WaitNS[j] = int64(w)
	}
	msg.Ops = make([]opCountMsg, len(r.Ops))
	for i, o := range r.Ops {
		msg.Ops[i] = opCountMsg{Op: o.Op, Algo: o.Algo, Count: o.Count}
	}
	moe, ok := moeMsgOf(r.MoE, n)
	if !ok {
		return fault.New(fault.ErrInvalidArgument, m.rank, "control: report's MoE figures do not fit %d ranks (or exceed %d experts, %d wire formats)",
			n, MaxReportExperts, maxReportWires)
	}
	msg.MoE = moe
	b, err := msgpack.Marshal(&msg)
	if err != nil {
		return fault.Wrap(fault.ErrInvalidArgument, m.rank, err, "control: encoding report")
	}
	if err := m.publish(svcSubject(m.group, opReport), "", m.epoch, sealed(b)); err != nil {
		return fault.Wrap(fault.ErrClosed, m.rank, err, "control: publishing report")
	}
	return nil
}

// TrafficView is what the ranks of one formed group reported (Service.Traffic).
type TrafficView struct {
	Group string
	Epoch uint32
	Size  int
	// Ranks holds one entry per rank, by rank.
	Ranks []RankTraffic
	// Ops are the operations by name and algorithm, most frequent first.
	Ops []OpTotal
}

// RankTraffic is one rank's latest report. Rates cover the interval between
// its last two reports and fall to zero once the rank is idle (it then stops
// reporting) or silent for several periods.
type RankTraffic struct {
	// Reported is when its latest report arrived (zero: none yet).
	Reported time.Time
	// Sent[j] is the bytes it sent rank j since it joined; SentRate the bytes
	// per second lately.
	Sent     []uint64
	SentRate []float64
	// Wait[j] is how long it waited for rank j's data since it joined (see
	// Report.Wait), WaitShare the part of the recent interval it spent so,
	// Last the operations in which rank j arrived last.
	Wait      []time.Duration
	WaitShare []float64
	Last      []uint64
	Errors    uint64
	// Local[j] is the bytes it moved to rank j through shared memory outside
	// its transport (the MoE dispatcher's rows; MoEReport.Local), LocalRate
	// the bytes per second lately. Zero for ranks that move none.
	Local     []uint64
	LocalRate []float64
	// MoE is its MoE layers' figures, nil if it reported none.
	MoE *RankMoE
}

// OpTotal counts the operations of one name and algorithm: Calls as counted
// by the rank that ran the most (every rank counts a collective once), Total
// summed over the ranks.
type OpTotal struct {
	Op, Algo     string
	Calls, Total uint64
}

// staleAfter is how many report periods without a report make a rank's
// rates read zero: it normally reports going idle itself, this covers a
// lost report or a dead rank.
const staleAfter = 3

// reportStore keeps the latest report of every rank of every group.
type reportStore struct {
	mu     sync.Mutex
	groups map[string]*groupReports
	pruned time.Time
}

type groupReports struct {
	epoch uint32
	ranks []rankReports
}

type rankReports struct {
	seq       uint64
	period    time.Duration
	elapsed   time.Duration
	recv      time.Time
	sent      []uint64
	wait      []int64
	last      []uint64
	sentRate  []float64
	waitShare []float64
	ops       []OpCount
	errors    uint64
	moe       *moeReports // nil until a report carries MoE figures
}

// onReport stores one rank's report if it belongs to a current formation.
func (s *Service) onReport(msg *nats.Msg) {
	var r reportMsg
	name := groupOfSvc(msg.Subject, opReport)
	if !validToken(name) {
		return
	}
	now := time.Now()
	world, err := s.openReport(msg, name, &r)
	switch {
	case err != nil:
		s.log.Debug("malformed report", "subject", msg.Subject, "err", err)
		return
	case world == 0:
		return // not (or no longer) a formation of ours
	case !r.fits(world):
		s.log.Debug("report does not fit its group", "group", name, "rank", r.Rank)
		return
	case !r.namesFit():
		return
	}
	if s.reports.store(name, &r, world, now) {
		s.pruneReports()
	}
}

// openReport opens and decodes the report msg of group name into r and
// returns the size of the formation it belongs to: 0, with a nil error,
// when it is not authentic, not signed by the rank it speaks for or not of
// a current formation of this open service.
func (s *Service) openReport(msg *nats.Msg, name string, r *reportMsg) (world int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Signed by a member of the formation it names, like every message.
	env, p, ok := s.open(msg, name)
	if !ok {
		return 0, nil
	}
	if err := unmarshal(p, r); err != nil {
		return 0, err
	}
	if s.closed {
		return 0, nil
	}
	g := s.groups[name]
	if g == nil || g.form == nil || g.form.epoch != r.Epoch || env.epoch != r.Epoch ||
		r.Rank < 0 || r.Rank >= g.form.world || g.form.ranks[r.Rank] == nil || g.form.ranks[r.Rank].sender != env.sender {
		return 0, nil
	}
	return g.form.world, nil
}

// fits reports whether r has one entry per rank of a group of world ranks
// and no more operation kinds than a report may carry.
func (r *reportMsg) fits(world int) bool {
	return r.Rank >= 0 && r.Rank < world && len(r.Sent) == world && len(r.WaitNS) == world && len(r.Last) == world &&
		len(r.Ops) <= maxReportOps && r.MoE.fits(world)
}

// namesFit reports whether r's operation and algorithm names are short
// enough to keep.
func (r *reportMsg) namesFit() bool {
	for _, o := range r.Ops {
		if len(o.Op) > maxReportNameLen || len(o.Algo) > maxReportNameLen {
			return false
		}
	}
	return true
}

// store keeps r, a report of a rank of group name (world ranks) that arrived
// at now, replacing the group's reports of an earlier formation. It reports
// whether the reports of groups that are gone are due for pruning.
func (st *reportStore) store(name string, r *reportMsg, world int, now time.Time) (prune bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.groups == nil {
		st.groups = make(map[string]*groupReports)
	}
	g := st.groups[name]
	if g == nil || g.epoch != r.Epoch {
		g = &groupReports{epoch: r.Epoch, ranks: make([]rankReports, world)}
		st.groups[name] = g
	}
	g.ranks[r.Rank].update(r, now)
	prune = now.Sub(st.pruned) > pruneEvery
	if prune {
		st.pruned = now
	}
	return prune
}

// pruneEvery is how often onReport drops the reports of groups that are gone.
const pruneEvery = 10 * time.Second

// update adopts report r, arrived at now, working out the rates since the
// previous one.
func (k *rankReports) update(r *reportMsg, now time.Time) {
	n := len(r.Sent)
	if k.sent == nil {
		k.sent, k.wait, k.last = make([]uint64, n), make([]int64, n), make([]uint64, n)
		k.sentRate, k.waitShare = make([]float64, n), make([]float64, n)
	}
	if r.Seq <= k.seq {
		return // a duplicate or reordered report
	}
	// Everything since the previous report happened after r.Since, unless a
	// report in between was lost.
	from := k.elapsed
	if r.Seq == k.seq+1 {
		from = max(from, time.Duration(r.Since))
	}
	dt := (time.Duration(r.Elapsed) - from).Seconds()
	for j := range n {
		var ds, dw float64
		if r.Sent[j] > k.sent[j] {
			ds = float64(r.Sent[j] - k.sent[j])
		}
		if r.WaitNS[j] > k.wait[j] {
			dw = float64(r.WaitNS[j]-k.wait[j]) / 1e9
		}
		k.sentRate[j], k.waitShare[j] = 0, 0
		if dt > 0 {
			k.sentRate[j], k.waitShare[j] = ds/dt, min(dw/dt, 1)
		}
	}
	copy(k.sent, r.Sent)
	copy(k.wait, r.WaitNS)
	copy(k.last, r.Last)
	if r.MoE != nil {
		if k.moe == nil {
			k.moe = &moeReports{}
		}
		k.moe.update(r.MoE, dt)
	}
	k.ops = k.ops[:0]
	for _, o := range r.Ops {
		k.ops = append(k.ops, OpCount{Op: o.Op, Algo: o.Algo, Count: o.Count})
	}
	k.seq, k.period, k.elapsed, k.recv, k.errors = r.Seq, time.Duration(r.PeriodNS), time.Duration(r.Elapsed), now, r.Errors
}

// pruneReports forgets the reports of groups whose formation is gone.
func (s *Service) pruneReports() {
	current := map[string]uint32{}
	s.mu.Lock()
	for name, g := range s.groups {
		if g.form != nil && g.form.epoch != 0 {
			current[name] = g.form.epoch
		}
	}
	s.mu.Unlock()
	st := &s.reports
	st.mu.Lock()
	for name, g := range st.groups {
		if current[name] != g.epoch {
			delete(st.groups, name)
		}
	}
	st.mu.Unlock()
}

// Traffic returns what the ranks of group reported since it formed, or false
// when the group has no formed membership or no rank reported yet. Ranks
// report only to a service made by NewService or StartService (a2ad serve).
func (s *Service) Traffic(group string) (TrafficView, bool) {
	s.mu.Lock()
	var epoch uint32
	if g := s.groups[group]; g != nil && g.form != nil {
		epoch = g.form.epoch
	}
	s.mu.Unlock()
	now := time.Now()
	st := &s.reports
	st.mu.Lock()
	defer st.mu.Unlock()
	g := st.groups[group]
	if epoch == 0 || g == nil || g.epoch != epoch {
		return TrafficView{}, false
	}
	v := TrafficView{Group: group, Epoch: epoch, Size: len(g.ranks), Ranks: make([]RankTraffic, len(g.ranks))}
	type key struct{ op, algo string }
	totals := map[key]*OpTotal{}
	for i := range g.ranks {
		k := &g.ranks[i]
		n := len(g.ranks)
		rt := RankTraffic{Reported: k.recv, Sent: make([]uint64, n), SentRate: make([]float64, n),
			Wait: make([]time.Duration, n), WaitShare: make([]float64, n), Last: make([]uint64, n), Errors: k.errors}
		fresh := now.Sub(k.recv) <= staleAfter*max(k.period, time.Second)
		if k.sent != nil {
			copy(rt.Sent, k.sent)
			copy(rt.Last, k.last)
			for j, w := range k.wait {
				rt.Wait[j] = time.Duration(w)
			}
			if fresh {
				copy(rt.SentRate, k.sentRate)
				copy(rt.WaitShare, k.waitShare)
			}
		}
		rt.Local, rt.LocalRate = make([]uint64, n), make([]float64, n)
		if k.moe != nil {
			rt.MoE = k.moe.view(fresh)
			copy(rt.Local, k.moe.latest.Local)
			if fresh {
				copy(rt.LocalRate, k.moe.localRate)
			}
		}
		v.Ranks[i] = rt
		for _, o := range k.ops {
			t := totals[key{o.Op, o.Algo}]
			if t == nil {
				t = &OpTotal{Op: o.Op, Algo: o.Algo}
				totals[key{o.Op, o.Algo}] = t
			}
			t.Calls = max(t.Calls, o.Count)
			t.Total += o.Count
		}
	}
	for _, t := range totals {
		v.Ops = append(v.Ops, *t)
	}
	slices.SortFunc(v.Ops, func(a, b OpTotal) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Op, b.Op), cmp.Compare(a.Algo, b.Algo))
	})
	return v, true
}
