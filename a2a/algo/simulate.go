package algo

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// Errors Simulate wraps, so tests can tell a hang from corrupted data.
var (
	// ErrDeadlock: no rank can progress while some rank is unfinished,
	// including frames one rank sends that its peer never receives.
	ErrDeadlock = errors.New("algo: schedules deadlock")
	// ErrMismatch: two matched frames disagree (length or Last flag), or
	// the ranks run different algorithms.
	ErrMismatch = errors.New("algo: schedules disagree")
	// ErrBadSchedule: a schedule is malformed on its own (spans out of
	// bounds, bad peer, overlapping writes within a round, ...).
	ErrBadSchedule = errors.New("algo: malformed schedule")
)

// Reducer computes dst = dst op src elementwise for the schedule's opaque
// DType and Op (package reduce's values). The simulator takes it as a
// function so that this package imports nothing of ours; tests build one on
// reduce.Reduce.
type Reducer func(dtype, op uint8, dst, src []byte) error

// Simulate is SimulateWith without a Reducer: schedules with reduce steps are
// rejected as malformed.
func Simulate(scheds []*Schedule, send, recv [][]byte) error {
	return SimulateWith(scheds, send, recv, nil)
}

// SimulateWith executes the schedules of all ranks (scheds[r] is rank r's) in
// memory, on the given send and receive buffers, and reports the first way the
// schedules would fail on a real transport. Reduce and RecvReduce steps call
// reduce with the schedule's DType and Op.
//
// Semantics are the strictest a transport may have, so that a schedule that
// passes here cannot deadlock anywhere:
//   - rendezvous: a send completes only when its receiver has posted the
//     matching receive (no buffering at all);
//   - sends and receives are matched first-to-first per (src, dst, stream);
//   - each rank runs its rounds in order; all steps of a round are in flight
//     together, so no step of a round may write bytes another step of that
//     round reads or writes (a RecvReduce writes both its landing Src and its
//     Dst); Copy and Reduce steps complete when their round starts, a
//     RecvReduce's reduction when its frame arrives;
//   - conflicts are found on memory, not on buffer names: a caller may pass
//     aliased send and receive buffers (in-place collectives), and a step of
//     one buffer then conflicts with a step of the other on the same bytes.
//     A Copy whose source and destination are the same bytes is a no-op
//     (the engine skips it too) and touches nothing;
//   - the caller's send buffer is read-only; scratch buffers of
//     Schedule.ScratchBytes are allocated per rank.
func SimulateWith(scheds []*Schedule, send, recv [][]byte, reduce Reducer) error {
	p := len(scheds)
	if len(send) != p || len(recv) != p {
		return fmt.Errorf("%w: %d schedules, %d send buffers, %d recv buffers", ErrBadSchedule, p, len(send), len(recv))
	}
	sim := &simulator{ranks: make([]simRank, p), chanIdx: make(map[simKey]int), reduce: reduce}
	for r, s := range scheds {
		if s == nil {
			return fmt.Errorf("%w: rank %d has no schedule", ErrBadSchedule, r)
		}
		if s.Algo != scheds[0].Algo {
			return fmt.Errorf("%w: rank %d runs %v, rank 0 runs %v", ErrMismatch, r, s.Algo, scheds[0].Algo)
		}
		if s0 := scheds[0]; s.DType != s0.DType || s.Op != s0.Op || s.ElemSize != s0.ElemSize {
			return fmt.Errorf("%w: rank %d reduces dtype %d op %d elem %d, rank 0 dtype %d op %d elem %d",
				ErrMismatch, r, s.DType, s.Op, s.ElemSize, s0.DType, s0.Op, s0.ElemSize)
		}
		if s.ScratchBytes < 0 {
			return fmt.Errorf("%w: rank %d: scratch %d bytes", ErrBadSchedule, r, s.ScratchBytes)
		}
		sim.ranks[r].s = s
		sim.ranks[r].bufs = [3][]byte{BufSend: send[r], BufRecv: recv[r], BufScratch: make([]byte, s.ScratchBytes)}
		for b, buf := range sim.ranks[r].bufs {
			sim.ranks[r].base[b] = uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		}
	}
	for r := range sim.ranks {
		if err := sim.load(r); err != nil {
			return err
		}
	}
	return sim.run()
}

type simKey struct{ src, dst, stream int }

// simChan is one ordered stream from src to dst: its frames in the order the
// sender posts them and the receives in the order the receiver posts them.
type simChan struct {
	simKey
	sends, recvs []int // step indices in the sender's / receiver's schedule
	next         int   // frames [0, next) are matched
	queued       bool
}

type simRank struct {
	s       *Schedule
	bufs    [3][]byte
	base    [3]uintptr // address of each buffer, to find conflicts between aliased buffers
	round   int        // current round; NumRounds() once finished
	pending int        // unmatched sends and receives of the current round
	roundOf []int      // step -> round
	chanOf  []int      // step -> channel (sends and receives only)
	seqOf   []int      // step -> index among its channel's sends or receives
}

func (rk *simRank) finished() bool { return rk.round >= rk.s.NumRounds() }

func (rk *simRank) bytes(sp Span) []byte { return rk.bufs[sp.Buf][sp.Off:sp.End()] }

// addr is where sp starts in memory.
func (rk *simRank) addr(sp Span) uintptr { return rk.base[sp.Buf] + uintptr(sp.Off) }

// noop reports whether st is a copy of some bytes onto themselves: what an
// in-place collective's Send-to-Recv copy becomes when the caller passes one
// buffer as both.
func (rk *simRank) noop(st *Step) bool {
	return st.Kind == StepCopy && st.Src.Len == st.Dst.Len && rk.addr(st.Src) == rk.addr(st.Dst)
}

// recvSpan is where a receiving step lands its frame.
func recvSpan(st *Step) Span {
	if reducesOnArrival(st) {
		return st.Src
	}
	return st.Dst
}

// reducesOnArrival reports whether st lands a message in Src and reduces it
// into Dst once in: a RecvReduce, or a Load with a third operand.
func reducesOnArrival(st *Step) bool {
	return st.Kind == StepRecvReduce || st.Kind == StepLoad && st.With.Len > 0
}

func isRecv(k StepKind) bool { return k == StepRecv || k == StepRecvReduce || k == StepLoad }

func isSend(k StepKind) bool { return k == StepSend || k == StepStore }

// llStream is the channel key of LL stores and loads: one slot per ordered
// pair, apart from the streams that carry frames.
const llStream = -1

// simSpan is one memory range a step touches, for the hazard check.
type simSpan struct {
	buf    Buf
	lo, hi uintptr
	write  bool
	step   int
}

type simulator struct {
	ranks   []simRank
	chans   []simChan
	chanIdx map[simKey]int
	queue   []int
	spans   []simSpan // per-round hazard check scratch
	reduce  Reducer
}

// load checks rank r's schedule on its own and registers its sends and
// receives with their channels.
func (sim *simulator) load(r int) error {
	rk := &sim.ranks[r]
	s := rk.s
	if err := checkRoundEnds(r, s); err != nil {
		return err
	}
	rk.roundOf = make([]int, len(s.Steps))
	rk.chanOf = make([]int, len(s.Steps))
	rk.seqOf = make([]int, len(s.Steps))
	round := 0
	for i := range s.Steps {
		for i >= s.RoundEnds[round] {
			round++
		}
		rk.roundOf[i] = round
		st := &s.Steps[i]
		if why := sim.loadStep(r, i, st); why != "" {
			return fmt.Errorf("%w: rank %d round %d step %d (%v): %s", ErrBadSchedule, r, round, i, st, why)
		}
	}
	return nil
}

// checkRoundEnds checks that rank r's RoundEnds cut its steps into rounds:
// in order, within the steps, the last ending with the last step.
func checkRoundEnds(r int, s *Schedule) error {
	prev := 0
	for i, e := range s.RoundEnds {
		if e < prev || e > len(s.Steps) {
			return fmt.Errorf("%w: rank %d: RoundEnds[%d]=%d out of order (previous %d, %d steps)", ErrBadSchedule, r, i, e, prev, len(s.Steps))
		}
		prev = e
	}
	if prev != len(s.Steps) {
		return fmt.Errorf("%w: rank %d: steps [%d, %d) belong to no round (missing EndRound)", ErrBadSchedule, r, prev, len(s.Steps))
	}
	return nil
}

// loadStep checks step i of rank r, and registers it with its channel when
// it sends or receives. It returns why the step is malformed, or "".
func (sim *simulator) loadStep(r, i int, st *Step) string {
	rk := &sim.ranks[r]
	switch st.Kind {
	case StepSend, StepRecv, StepRecvReduce, StepStore, StepLoad:
		if why := sim.checkTransfer(rk, st); why != "" {
			return why
		}
		sim.register(r, i, st)
		return ""
	case StepCopy:
		return rk.checkCopy(st)
	case StepReduce:
		if why := rk.checkSpan(st.Src, false); why != "" {
			return "source: " + why
		}
		return sim.checkReduce(rk, st)
	}
	return "unknown step kind"
}

// checkTransfer returns why a step that sends or receives is malformed, or
// "": its peer, its stream, the span it sends or lands in and, for a
// RecvReduce, the reduction.
func (sim *simulator) checkTransfer(rk *simRank, st *Step) string {
	p := len(sim.ranks)
	switch {
	case st.Peer < 0 || st.Peer >= p:
		return fmt.Sprintf("peer %d out of range [0, %d)", st.Peer, p)
	case st.Stream < 0:
		return "negative stream"
	case st.CountOnly && st.Kind != StepStore && st.Kind != StepLoad:
		return "count-only is for LL stores and loads"
	}
	sp := st.Src
	if isRecv(st.Kind) {
		sp = recvSpan(st)
	}
	if why := rk.checkSpan(sp, isRecv(st.Kind)); why != "" {
		return why
	}
	if reducesOnArrival(st) {
		return sim.checkReduce(rk, st)
	}
	return ""
}

// checkCopy returns why a Copy step is malformed, or "".
func (rk *simRank) checkCopy(st *Step) string {
	if why := rk.checkSpan(st.Src, false); why != "" {
		return "source: " + why
	}
	if why := rk.checkSpan(st.Dst, true); why != "" {
		return "destination: " + why
	}
	if st.Src.Len != st.Dst.Len {
		return fmt.Sprintf("copies %d bytes into %d", st.Src.Len, st.Dst.Len)
	}
	return ""
}

// register appends step i of rank r, which sends or receives, to its
// channel: the ordered stream of (sender, receiver, stream), where LL
// stores and loads have a slot of their own (llStream).
func (sim *simulator) register(r, i int, st *Step) {
	rk := &sim.ranks[r]
	stream := st.Stream
	if st.Kind == StepStore || st.Kind == StepLoad {
		stream = llStream
	}
	key := simKey{src: r, dst: st.Peer, stream: stream}
	if isRecv(st.Kind) {
		key = simKey{src: st.Peer, dst: r, stream: stream}
	}
	ci, ok := sim.chanIdx[key]
	if !ok {
		ci = len(sim.chans)
		sim.chanIdx[key] = ci
		sim.chans = append(sim.chans, simChan{simKey: key})
	}
	c := &sim.chans[ci]
	rk.chanOf[i] = ci
	if isSend(st.Kind) {
		rk.seqOf[i] = len(c.sends)
		c.sends = append(c.sends, i)
	} else {
		rk.seqOf[i] = len(c.recvs)
		c.recvs = append(c.recvs, i)
	}
}

// checkReduce returns why the reduction of a Reduce or RecvReduce step cannot
// run, or "": its destination, the lengths and the element size.
func (sim *simulator) checkReduce(rk *simRank, st *Step) string {
	if sim.reduce == nil {
		return "reduce steps are not supported without a Reducer (SimulateWith)"
	}
	if err := rk.checkSpan(st.Dst, true); err != "" {
		return "destination: " + err
	}
	if st.Src.Len != st.Dst.Len {
		return fmt.Sprintf("reduces %d bytes into %d", st.Src.Len, st.Dst.Len)
	}
	if st.With.Len > 0 {
		if st.Kind != StepRecvReduce && st.Kind != StepReduce && st.Kind != StepLoad {
			return "a third operand is only allowed on reduce, recvreduce and load"
		}
		if err := rk.checkSpan(st.With, false); err != "" {
			return "third operand: " + err
		}
		if st.With.Len != st.Dst.Len {
			return fmt.Sprintf("third operand of %d bytes for %d", st.With.Len, st.Dst.Len)
		}
	}
	if e := rk.s.ElemSize; e > 0 && st.Dst.Len%e != 0 {
		return fmt.Sprintf("reduces %d bytes, not a multiple of the %d-byte element", st.Dst.Len, e)
	}
	return ""
}

// checkSpan returns why sp is not a valid span of rank rk's buffers, or "".
func (rk *simRank) checkSpan(sp Span, write bool) string {
	if sp.Buf > BufScratch {
		return fmt.Sprintf("unknown buffer %v", sp.Buf)
	}
	if write && sp.Buf == BufSend {
		return "writes the caller's send buffer"
	}
	if sp.Off < 0 || sp.Len < 0 || sp.End() > len(rk.bufs[sp.Buf]) {
		return fmt.Sprintf("span %v[%d:%d] out of bounds (buffer has %d bytes)", sp.Buf, sp.Off, sp.End(), len(rk.bufs[sp.Buf]))
	}
	return ""
}

func (sim *simulator) run() error {
	for r := range sim.ranks {
		if err := sim.enter(r); err != nil {
			return err
		}
	}
	for len(sim.queue) > 0 {
		ci := sim.queue[len(sim.queue)-1]
		sim.queue = sim.queue[:len(sim.queue)-1]
		sim.chans[ci].queued = false
		if err := sim.match(ci); err != nil {
			return err
		}
	}
	for r := range sim.ranks {
		if !sim.ranks[r].finished() {
			return sim.deadlock()
		}
	}
	// Unreachable with rendezvous (a rank cannot finish with an unmatched
	// frame), kept so that a future buffered mode cannot pass silently.
	for i := range sim.chans {
		c := &sim.chans[i]
		if c.next != len(c.sends) || c.next != len(c.recvs) {
			return fmt.Errorf("%w: %d->%d stream %d: %d frames sent, %d received", ErrDeadlock, c.src, c.dst, c.stream, len(c.sends), len(c.recvs))
		}
	}
	return nil
}

// enter starts rank r's current round: it checks the round for conflicting
// accesses, performs its copies and posts its sends and receives; rounds
// without any send or receive complete at once.
func (sim *simulator) enter(r int) error {
	rk := &sim.ranks[r]
	for !rk.finished() {
		steps := rk.s.Round(rk.round)
		if err := sim.checkHazards(r, steps); err != nil {
			return err
		}
		rk.pending = 0
		for i := range steps {
			st := &steps[i]
			switch st.Kind {
			case StepCopy:
				copy(rk.bytes(st.Dst), rk.bytes(st.Src))
			case StepReduce:
				if err := sim.doReduce(r, st); err != nil {
					return err
				}
			case StepSend, StepRecv, StepRecvReduce, StepStore, StepLoad:
				rk.pending++
				ci := rk.chanOf[sim.stepIndex(rk, i)]
				if !sim.chans[ci].queued {
					sim.chans[ci].queued = true
					sim.queue = append(sim.queue, ci)
				}
			}
		}
		if rk.pending > 0 {
			return nil
		}
		rk.round++
	}
	return nil
}

// doReduce applies the reduction of a Reduce or RecvReduce step of rank r.
func (sim *simulator) doReduce(r int, st *Step) error {
	rk := &sim.ranks[r]
	dst, src := rk.bytes(st.Dst), rk.bytes(st.Src)
	if st.With.Len > 0 {
		// Three operands through the two-operand reducer: first op second
		// computed in a temporary, since dst may be the landing span.
		first, second := rk.bytes(st.With), src
		if st.LandedFirst {
			first, second = src, rk.bytes(st.With)
		}
		tmp := append([]byte(nil), first...)
		if err := sim.reduce(rk.s.DType, rk.s.Op, tmp, second); err != nil {
			return fmt.Errorf("%w: rank %d round %d: %v: %w", ErrBadSchedule, r, rk.round, st, err)
		}
		copy(dst, tmp)
		return nil
	}
	if err := sim.reduce(rk.s.DType, rk.s.Op, dst, src); err != nil {
		return fmt.Errorf("%w: rank %d round %d: %v: %w", ErrBadSchedule, r, rk.round, st, err)
	}
	return nil
}

// stepIndex converts an index within the current round to one within Steps.
func (sim *simulator) stepIndex(rk *simRank, i int) int {
	if rk.round == 0 {
		return i
	}
	return rk.s.RoundEnds[rk.round-1] + i
}

// match completes, in order, every frame of channel ci whose send and receive
// are both posted.
func (sim *simulator) match(ci int) error {
	c := &sim.chans[ci]
	src, dst := &sim.ranks[c.src], &sim.ranks[c.dst]
	for c.next < len(c.sends) && c.next < len(c.recvs) {
		si, ri := c.sends[c.next], c.recvs[c.next]
		if src.roundOf[si] != src.round || dst.roundOf[ri] != dst.round {
			return nil
		}
		ss, rs := &src.s.Steps[si], &dst.s.Steps[ri]
		land := recvSpan(rs)
		if ss.Src.Len != land.Len || ss.Last != rs.Last || ss.CountOnly != rs.CountOnly {
			return fmt.Errorf("%w: frame %d from rank %d to rank %d on stream %d: sender (round %d) sends %d bytes last=%t count-only=%t, receiver (round %d) expects %d bytes last=%t count-only=%t",
				ErrMismatch, c.next, c.src, c.dst, c.stream, src.round, ss.Src.Len, ss.Last, ss.CountOnly, dst.round, land.Len, rs.Last, rs.CountOnly)
		}
		if !ss.CountOnly {
			copy(dst.bytes(land), src.bytes(ss.Src))
		}
		if reducesOnArrival(rs) {
			if err := sim.doReduce(c.dst, rs); err != nil {
				return err
			}
		}
		c.next++
		src.pending--
		dst.pending--
		if src.pending == 0 {
			src.round++
			if err := sim.enter(c.src); err != nil {
				return err
			}
		}
		if c.dst != c.src && dst.pending == 0 {
			dst.round++
			if err := sim.enter(c.dst); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkHazards rejects a round in which one step writes bytes that another
// step of the same round reads or writes: the steps run concurrently on a real
// transport, so the outcome would depend on timing. It compares memory, so
// aliased send and receive buffers are checked too.
func (sim *simulator) checkHazards(r int, steps []Step) error {
	rk := &sim.ranks[r]
	sp := sim.spans[:0]
	for i := range steps {
		sp = rk.appendStepSpans(sp, &steps[i], i)
	}
	sim.spans = sp
	slices.SortFunc(sp, func(a, b simSpan) int { return cmp.Compare(a.lo, b.lo) })
	other, x := firstOverlap(sp)
	if x == nil {
		return nil
	}
	where := fmt.Sprintf("the %v buffer", x.buf)
	if other.buf != x.buf {
		where = fmt.Sprintf("the %v and %v buffers (aliased)", other.buf, x.buf)
	}
	return fmt.Errorf("%w: rank %d round %d: step %v and step %v access overlapping bytes of %s concurrently",
		ErrBadSchedule, r, rk.round, steps[other.step], steps[x.step], where)
}

// appendStepSpans appends to sp the memory that step i (st) of a round
// reads and writes while the round runs.
func (rk *simRank) appendStepSpans(sp []simSpan, st *Step, i int) []simSpan {
	switch st.Kind {
	case StepSend:
		sp = rk.appendSpan(sp, st.Src, false, i)
	case StepRecv:
		sp = rk.appendSpan(sp, st.Dst, true, i)
	case StepStore:
		if !st.CountOnly {
			sp = rk.appendSpan(sp, st.Src, false, i)
		}
	case StepLoad:
		if reducesOnArrival(st) {
			sp = rk.appendReduceSpans(sp, st, i)
		} else if !st.CountOnly {
			sp = rk.appendSpan(sp, st.Dst, true, i)
		}
	case StepCopy:
		if !rk.noop(st) {
			sp = rk.appendSpan(sp, st.Src, false, i)
			sp = rk.appendSpan(sp, st.Dst, true, i)
		}
	case StepReduce:
		// An operand exactly aliasing Dst (in place) is what a three-operand
		// kernel supports; only other overlaps race.
		if st.With.Len == 0 || rk.addr(st.Src) != rk.addr(st.Dst) {
			sp = rk.appendSpan(sp, st.Src, false, i)
		}
		if st.With.Len > 0 && rk.addr(st.With) != rk.addr(st.Dst) {
			sp = rk.appendSpan(sp, st.With, false, i)
		}
		sp = rk.appendSpan(sp, st.Dst, true, i)
	case StepRecvReduce:
		sp = rk.appendReduceSpans(sp, st, i)
	}
	return sp
}

// appendReduceSpans appends the memory of a step that reduces a message on
// arrival (reducesOnArrival): the landing span and Dst written, With read.
func (rk *simRank) appendReduceSpans(sp []simSpan, st *Step, i int) []simSpan {
	sp = rk.appendSpan(sp, st.Src, true, i)
	if st.Dst != st.Src {
		sp = rk.appendSpan(sp, st.Dst, true, i)
	}
	if st.With.Len > 0 && rk.addr(st.With) != rk.addr(st.Dst) {
		// A third operand exactly aliasing Dst (in place) is what
		// a three-operand kernel supports; only other overlaps race.
		sp = rk.appendSpan(sp, st.With, false, i)
	}
	return sp
}

// appendSpan appends the memory of s, read or written by step i, to sp; an
// empty span touches nothing.
func (rk *simRank) appendSpan(sp []simSpan, s Span, write bool, i int) []simSpan {
	if s.Len <= 0 {
		return sp
	}
	a := rk.addr(s)
	return append(sp, simSpan{buf: s.Buf, lo: a, hi: a + uintptr(s.Len), write: write, step: i})
}

// firstOverlap returns the first span x of sp (sorted by start) that
// overlaps an earlier span other where at least one of the two writes, or
// nils. Sorted by start, an earlier span overlaps the current one iff it
// ends after the current one starts; tracking the furthest-reaching earlier
// span (and earlier write) finds every conflicting pair class. Distinct
// buffers never share memory unless the caller aliased them, so one pass
// over all spans covers both cases.
func firstOverlap(sp []simSpan) (other, x *simSpan) {
	var far, farWrite *simSpan
	for i := range sp {
		x = &sp[i]
		switch {
		case farWrite != nil && farWrite.hi > x.lo:
			return farWrite, x
		case x.write && far != nil && far.hi > x.lo:
			return far, x
		}
		if far == nil || x.hi > far.hi {
			far = x
		}
		if x.write && (farWrite == nil || x.hi > farWrite.hi) {
			farWrite = x
		}
	}
	return nil, nil
}

// deadlock describes, for each stuck rank, what it waits for and why.
func (sim *simulator) deadlock() error {
	const maxRanks, maxSteps = 8, 3
	var stuck []int
	for r := range sim.ranks {
		if !sim.ranks[r].finished() {
			stuck = append(stuck, r)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ranks %v cannot progress", stuck)
	for n, r := range stuck {
		if n == maxRanks {
			fmt.Fprintf(&b, "; ... %d more ranks", len(stuck)-maxRanks)
			break
		}
		rk := &sim.ranks[r]
		fmt.Fprintf(&b, "; rank %d in round %d/%d waits for", r, rk.round, rk.s.NumRounds())
		shown, waiting := 0, 0
		base := sim.stepIndex(rk, 0)
		for i, st := range rk.s.Round(rk.round) {
			if !isSend(st.Kind) && !isRecv(st.Kind) {
				continue
			}
			si := base + i
			c := &sim.chans[rk.chanOf[si]]
			if rk.seqOf[si] < c.next {
				continue
			}
			waiting++
			if shown == maxSteps {
				continue
			}
			shown++
			if shown > 1 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s", sim.why(r, si, c))
		}
		if waiting > shown {
			fmt.Fprintf(&b, " and %d more frames", waiting-shown)
		}
	}
	return fmt.Errorf("%w: %s", ErrDeadlock, b.String())
}

// why explains what unmatched step si of rank r waits for.
func (sim *simulator) why(r, si int, c *simChan) string {
	rk := &sim.ranks[r]
	st := &rk.s.Steps[si]
	q := rk.seqOf[si]
	what, other, peerKind := fmt.Sprintf("send of frame %d to %d on stream %d", q, st.Peer, st.Stream), c.recvs, "receive"
	if isRecv(st.Kind) {
		what, other, peerKind = fmt.Sprintf("receive of frame %d from %d on stream %d", q, st.Peer, st.Stream), c.sends, "send"
	}
	pr := &sim.ranks[st.Peer]
	switch {
	case q > c.next:
		return fmt.Sprintf("%s (behind unmatched frame %d)", what, c.next)
	case q >= len(other):
		return fmt.Sprintf("%s (unmatched: rank %d posts only %d %ss on that stream)", what, st.Peer, len(other), peerKind)
	case pr.finished():
		return fmt.Sprintf("%s (rank %d finished)", what, st.Peer)
	default:
		return fmt.Sprintf("%s (rank %d is in round %d, posts the matching %s in round %d)", what, st.Peer, pr.round, peerKind, pr.roundOf[other[q]])
	}
}
