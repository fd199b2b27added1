package a2a

import (
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
)

// DefaultReportPeriod is how often a rank looks at its traffic figures and,
// when they changed, reports them to the control-plane service for a2ad
// serve's live view (Config.Report).
const DefaultReportPeriod = time.Second

// reportOps are the operations a Comm counts for its reports, in the order
// of reportOp's indices.
var reportOps = [...]string{"alltoallv", "alltoall", "allreduce", "reducescatter", "allgather", "allgatherv",
	"broadcast", "reduce", "gather", "gatherv", "scatter", "scatterv", "barrier", "send", "recv"}

// reportOp is the index of an operation name in reportOps (-1: not counted).
// A switch, so counting an operation costs no search.
func reportOp(name string) int {
	switch name {
	case "alltoallv":
		return 0
	case "alltoall":
		return 1
	case "allreduce":
		return 2
	case "reducescatter":
		return 3
	case "allgather":
		return 4
	case "allgatherv":
		return 5
	case "broadcast":
		return 6
	case "reduce":
		return 7
	case "gather":
		return 8
	case "gatherv":
		return 9
	case "scatter":
		return 10
	case "scatterv":
		return 11
	case "barrier":
		return 12
	case "send":
		return 13
	case "recv":
		return 14
	}
	return -1
}

// algoSlots bounds the algorithm ids counted per operation (algo.Algo ids
// are small and new ones are appended).
const algoSlots = 32

// tally is what a Comm counts for its reports, under the operation lock:
// plain additions in storage allocated at join, so an operation pays a few
// adds and no allocation, atomic or clock read. The transport already counts
// the bytes per peer.
type tally struct {
	ops [len(reportOps)][algoSlots]uint64
	// rows marks the rows of ops counted in: merge and reset touch only
	// those (ops is 3.75 KiB, and a Persistent flushes every tallyBatch uses).
	rows   uint16
	_      [16 - len(reportOps)]struct{} // rows has a bit for every operation
	errors uint64
	wait   []time.Duration // by peer: see control.Report.Wait
	last   []uint64
}

func newTally(size int) tally {
	return tally{wait: make([]time.Duration, size), last: make([]uint64, size)}
}

// add counts one finished operation; lastPeer and lastWait are the engine's
// wait attribution for it (lastPeer -1: none).
func (t *tally) add(op string, a algo.Algo, lastPeer int, lastWait time.Duration, err error) {
	if i := reportOp(op); i >= 0 && int(a) < algoSlots {
		t.ops[i][a]++
		t.rows |= 1 << i
	}
	if err != nil {
		t.errors++
		return
	}
	if lastPeer >= 0 && lastPeer < len(t.wait) {
		t.wait[lastPeer] += lastWait
		t.last[lastPeer]++
	}
}

// merge adds o's figures to t (of as many ranks).
func (t *tally) merge(o *tally) {
	for rows := o.rows; rows != 0; rows &= rows - 1 {
		i := bits.TrailingZeros16(rows)
		for a := range t.ops[i] {
			t.ops[i][a] += o.ops[i][a]
		}
	}
	t.rows |= o.rows
	t.errors += o.errors
	for j := range o.wait {
		t.wait[j] += o.wait[j]
		t.last[j] += o.last[j]
	}
}

// reset zeroes t, keeping its storage.
func (t *tally) reset() {
	for rows := t.rows; rows != 0; rows &= rows - 1 {
		t.ops[bits.TrailingZeros16(rows)] = [algoSlots]uint64{}
	}
	t.rows, t.errors = 0, 0
	clear(t.wait)
	clear(t.last)
}

// copyTo copies t into dst, reusing dst's storage.
func (t *tally) copyTo(dst *tally) {
	dst.ops, dst.rows, dst.errors = t.ops, t.rows, t.errors
	dst.wait = append(dst.wait[:0], t.wait...)
	dst.last = append(dst.last[:0], t.last...)
}

// equal reports whether t and o hold the same figures.
func (t *tally) equal(o *tally) bool {
	return t.ops == o.ops && t.errors == o.errors && slices.Equal(t.wait, o.wait) && slices.Equal(t.last, o.last)
}

// MoEReporter is an Observer that also keeps the figures of the MoE layers
// above the Comm (*metrics.Observer, which package dispatch tells of every
// step). The Comm adds them to its traffic reports, so a2ad serve's live
// view shows the MoE layer without a collective of its own.
type MoEReporter interface {
	// MoEReport copies the figures into dst, reusing its storage, and
	// returns a number that grows whenever they change (0: none yet). It is
	// called from the Comm's reporting goroutine once per report period.
	MoEReport(dst *control.MoEReport) uint64
}

// reporter publishes a Comm's traffic reports from its own goroutine.
type reporter struct {
	period time.Duration
	mu     sync.Mutex // guards t
	t      tally
	stop   chan struct{}
	done   chan struct{}
}

// tallyOp counts a collective that just finished for the reports. Called
// before the collective ends, so the engine's wait figures are its own.
func (c *Comm) tallyOp(op string, a algo.Algo, err error) {
	if r := c.rep; r != nil {
		peer, wait := c.eng.LastArrival()
		r.mu.Lock()
		r.t.add(op, a, peer, wait, err)
		r.mu.Unlock()
	}
}

// tallyP2P counts a finished point-to-point call: its peer is the one it
// waited for, as long as the call lasted.
func (c *Comm) tallyP2P(r *Request) {
	if rep := c.rep; rep != nil {
		var wait time.Duration
		if !r.start.IsZero() {
			wait = time.Since(r.start)
		}
		rep.mu.Lock()
		rep.t.add(r.name(), algo.AlgoDirect, r.peer, wait, r.err)
		rep.mu.Unlock()
	}
}

// startReports starts the reporting goroutine unless Config.Report is
// negative or the group is a single rank (nothing to show).
func (c *Comm) startReports() {
	if c.cfg.Report < 0 || c.size < 2 {
		return
	}
	// Set before Join returns the Comm: no operation or Close runs yet.
	c.rep = &reporter{period: c.cfg.Report, t: newTally(c.size), stop: make(chan struct{}), done: make(chan struct{})}
	go c.runReports(c.rep)
}

// stopReports stops the reporting goroutine after its last report.
func (c *Comm) stopReports() {
	if r := c.rep; r != nil {
		close(r.stop)
		<-r.done
	}
}

// runReports looks at the figures every period and publishes them when they
// changed since the last report, plus once more when they stop changing (so
// the live view shows the rank idle), and a last time when the Comm closes.
// An idle rank publishes nothing.
func (c *Comm) runReports(r *reporter) {
	defer close(r.done)
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	start := time.Now()
	var cur, pub tally
	var sent, pubSent []uint64
	var seq uint64
	var since time.Duration // when the figures were read before
	active := false         // the last report carried changes
	moeSrc, _ := c.cfg.Observer.(MoEReporter)
	var moe control.MoEReport
	var moeVer, pubMoeVer uint64
	for {
		final := false
		select {
		case <-r.stop:
			final = true
		case <-tick.C:
		}
		r.mu.Lock()
		r.t.copyTo(&cur)
		r.mu.Unlock()
		sent = append(sent[:0], c.tr.Stats().BytesSent...)
		elapsed := time.Since(start)
		if moeSrc != nil {
			moeVer = moeSrc.MoEReport(&moe)
		}
		changed := !cur.equal(&pub) || !slices.Equal(sent, pubSent) || moeVer != pubMoeVer
		if changed || (active && !final) {
			seq++
			rep := control.Report{Seq: seq, Period: r.period, Elapsed: elapsed, Since: since,
				Sent: sent, Wait: cur.wait, Last: cur.last, Errors: cur.errors}
			for i := range cur.ops {
				for a, n := range cur.ops[i] {
					if n > 0 {
						rep.Ops = append(rep.Ops, control.OpCount{Op: reportOps[i], Algo: algo.Algo(a).String(), Count: n})
					}
				}
			}
			if moeVer != 0 {
				rep.MoE = c.fitMoE(&moe)
			}
			if len(rep.Sent) == c.size {
				if err := c.member.Report(&rep); err != nil {
					c.log.Debug("a2a: traffic report not sent", "err", err)
				}
			}
			cur.copyTo(&pub)
			pubSent = append(pubSent[:0], sent...)
			pubMoeVer = moeVer
			active = changed
		}
		since = elapsed
		if final {
			return
		}
	}
}

// fitMoE drops the figures of m a report cannot carry, so they cannot void
// it: by rank when they do not match the Comm's size (an Observer kept
// across a shrink), by expert past control.MaxReportExperts.
func (c *Comm) fitMoE(m *control.MoEReport) *control.MoEReport {
	if len(m.Tokens) > control.MaxReportExperts {
		m.Tokens = nil
	}
	if len(m.RankRows) != c.size {
		m.RankRows = nil
	}
	if len(m.Local) != c.size {
		m.Local = nil
	}
	return m
}

// tallyBatch is how many uses of a Persistent are counted on the Persistent
// before they are added to the Comm's tally: one lock round per batch
// instead of one per use, at most this many uses behind in a report.
const tallyBatch = 64

// pendingUses is a Persistent's uses not yet added to the Comm's tally.
type pendingUses struct {
	n int
	t tally
}

// tallyUse counts a use for the reports (as tallyOp counts a call), in
// batches of tallyBatch; an error is added at once.
func (p *Persistent) tallyUse(err error) {
	u := p.pend
	if u == nil {
		return
	}
	peer, wait := p.c.eng.LastArrival()
	u.t.add(p.name, p.algo, peer, wait, err)
	if u.n++; u.n >= tallyBatch || err != nil {
		p.flushTally()
	}
}

// flushTally adds the uses counted on p to the Comm's tally.
func (p *Persistent) flushTally() {
	u, r := p.pend, p.c.rep
	if u == nil || u.n == 0 {
		return
	}
	r.mu.Lock()
	r.t.merge(&u.t)
	r.mu.Unlock()
	u.n = 0
	u.t.reset()
}
