package control

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// maxPendingSeqs bounds the counts operations a formation keeps open at once,
// so a rank that keeps sending rows nobody matches cannot grow the service
// without bound.
const maxPendingSeqs = 1024

// keepDone is how many completed counts ops a formation keeps to answer
// re-sent rows: a rank waits for at most the ops it has in flight, and the
// others cannot complete many more without its rows. keepDoneSeqs is how many
// completed seqs it remembers beyond those.
const (
	keepDone     = 8
	keepDoneSeqs = 64
)

// aggregation is the counts state of a formed roster: the ops waiting for
// rows and the last completed ones. Guarded by Service.mu.
type aggregation struct {
	pending map[uint64]*countsOp
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

// countsOp collects the rows of one counts operation (seq) of n ranks.
type countsOp struct {
	arrived int
	have    []bool
	want    []bool
	reply   []string
	mat     []byte // N*N little-endian int64, row-major
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
		kind, detail = f.leftRank()
	}
	var op *countsOp
	if kind == nil {
		if d := f.counts.done[rw.seq]; d != nil {
			// A re-sent row: its rank did not get its column.
			s.mu.Unlock()
			s.resendColumn(d, f.world, rw, msg.Reply, name)
			return
		}
		if f.counts.completed(rw.seq) {
			s.mu.Unlock()
			return // a late copy of a row of a long completed op
		}
		op = f.counts.pending[rw.seq]
		if op == nil {
			if len(f.counts.pending) >= maxPendingSeqs {
				kind, detail = fault.ErrInvalidArgument, fmt.Sprintf("more than %d counts operations pending", maxPendingSeqs)
			} else {
				op = f.counts.getOp(f.world)
				f.counts.pending[rw.seq] = op
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
	if !op.add(rw, msg.Reply, n) {
		s.mu.Unlock()
		return
	}
	delete(f.counts.pending, rw.seq)
	epoch := f.epoch
	s.mu.Unlock()

	// The op is no longer reachable from the formation: send without the lock.
	s.sendColumns(op, n, name, rw.seq, epoch)

	s.mu.Lock()
	f.counts.keep(rw.seq, op)
	s.mu.Unlock()
}

// leftRank refuses a counts row of the formed roster f once one of its
// ranks has left: the operation cannot complete.
func (f *formation) leftRank() (kind error, detail string) {
	for r, st := range f.ranks {
		if st.left {
			return fault.ErrClosed, fmt.Sprintf("rank %d left the group", r)
		}
	}
	return nil, ""
}

// add takes the row rw of an op of n ranks, answered on reply (a row sent
// again replaces the first), and reports whether every rank's row is in.
func (op *countsOp) add(rw row, reply string, n int) bool {
	if !op.have[rw.rank] {
		op.have[rw.rank] = true
		op.arrived++
	}
	copy(op.mat[rw.rank*n*8:], rw.counts)
	op.reply[rw.rank] = reply
	op.want[rw.rank] = rw.flags&rowWantMatrix != 0
	return op.arrived >= n
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
func (a *aggregation) keep(seq uint64, op *countsOp) {
	a.doneSeqs[a.doneNext] = seq + 1
	a.doneNext = (a.doneNext + 1) % keepDoneSeqs
	a.done[seq] = op
	// Only the last keepDone keep their matrices (keepDone < keepDoneSeqs).
	if evict := a.doneSeqs[(a.doneNext+keepDoneSeqs-keepDone-1)%keepDoneSeqs]; evict != 0 {
		if d := a.done[evict-1]; d != nil {
			delete(a.done, evict-1)
			a.putOp(d)
		}
	}
}

// completed reports whether seq is one of the last completed ops.
func (a *aggregation) completed(seq uint64) bool {
	return slices.Contains(a.doneSeqs[:], seq+1)
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

// getOp returns a recycled op of n ranks, or a new one.
func (a *aggregation) getOp(n int) *countsOp {
	if k := len(a.free); k > 0 {
		op := a.free[k-1]
		a.free = a.free[:k-1]
		return op
	}
	return &countsOp{have: make([]bool, n), want: make([]bool, n), reply: make([]string, n), mat: make([]byte, n*n*8)}
}

// putOp recycles op (a few are kept).
func (a *aggregation) putOp(op *countsOp) {
	op.arrived = 0
	clear(op.have)
	clear(op.want)
	clear(op.reply)
	if len(a.free) < 4 {
		a.free = append(a.free, op)
	}
}

// ColumnsResent returns how many counts columns the service sent again
// because their rank re-sent its row (the first column was lost).
func (s *Service) ColumnsResent() uint64 { return s.retried.Load() }
