package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/a2a-moe/a2a/a2a"
)

// rankState is what one rank keeps across operations: its communicator,
// the run's seed and buffers sized once for the largest operation, so the
// soak's own allocations do not blur the leak check.
type rankState struct {
	c    *a2a.Comm
	seed uint64
	me   int
	p    int

	send, recv, want, scratch []byte
	sendCounts, recvCounts    []int
	matrix                    []int

	// inject makes this rank send one wrong byte in its next AllToAllV
	// (to prove the check fails).
	inject bool
	bytes  int64 // verified bytes received
}

// maxBlock is the largest block a rank sends one peer in one operation:
// past 512 KiB so AllToAllV messages span several frames and AllReduce runs
// segmented.
const maxBlock = 600 << 10

func newRankState(p int, seed uint64) *rankState {
	total := p * maxBlock
	return &rankState{
		seed: seed, p: p,
		send: make([]byte, total), recv: make([]byte, total),
		want: make([]byte, total), scratch: make([]byte, total),
		sendCounts: make([]int, p), recvCounts: make([]int, p), matrix: make([]int, p*p),
	}
}

// touch writes every buffer once, so their pages are resident before the
// leak check's baseline.
func (s *rankState) touch() {
	for _, b := range [][]byte{s.send, s.recv, s.want, s.scratch} {
		for i := range b {
			b[i] = byte(i)
		}
	}
}

// op is one kind of soak operation. run executes it as operation number seq
// with parameters drawn from rng, which every rank seeds alike so all
// of them draw the same ones.
type op struct {
	name   string
	weight int
	run    func(s *rankState, ctx context.Context, rng *rand.Rand, seq int64) error
}

// ops are the operations a soak session draws from.
var ops = []op{
	{"alltoall", 6, (*rankState).allToAll},
	{"alltoallv", 10, (*rankState).allToAllV},
	{"alltoallv-matrix", 6, (*rankState).allToAllVMatrix},
	{"alltoallv-inband", 6, (*rankState).allToAllVInBand},
	{"exchangecounts+alltoallv", 5, (*rankState).exchangeCounts},
	{"exchangecountsmatrix+alltoallv", 3, (*rankState).exchangeCountsMatrix},
	{"allreduce", 8, (*rankState).allReduce},
	{"reducescatter", 4, (*rankState).reduceScatter},
	{"reduce", 4, (*rankState).reduceOp},
	{"allgather", 4, (*rankState).allGather},
	{"allgatherv", 4, (*rankState).allGatherV},
	{"broadcast", 4, (*rankState).broadcast},
	{"gather", 3, (*rankState).gather},
	{"gatherv", 3, (*rankState).gatherV},
	{"scatter", 3, (*rankState).scatter},
	{"scatterv", 3, (*rankState).scatterV},
	{"barrier", 3, (*rankState).barrier},
	{"sendrecv-pairs", 6, (*rankState).sendRecvPairs},
	{"send-one", 4, (*rankState).sendOne},
}

// drawOp picks an operation by weight.
func drawOp(rng *rand.Rand) *op {
	total := 0
	for i := range ops {
		total += ops[i].weight
	}
	x := rng.IntN(total)
	for i := range ops {
		if x < ops[i].weight {
			return &ops[i]
		}
		x -= ops[i].weight
	}
	panic("unreachable")
}

// drawMatrix fills s.matrix with every pair's size for one operation, and
// this rank's send and receive counts from it.
func (s *rankState) drawMatrix(rng *rand.Rand) {
	for i := range s.matrix {
		s.matrix[i] = sizeOf(rng, maxBlock)
	}
	for j := range s.p {
		s.sendCounts[j] = s.matrix[s.me*s.p+j]
		s.recvCounts[j] = s.matrix[j*s.p+s.me]
	}
}

// fillSend writes this rank's blocks for every peer by s.sendCounts into
// s.send and returns the used part.
func (s *rankState) fillSend(seq int64) []byte {
	off := 0
	for j, n := range s.sendCounts {
		pattern(s.send[off:off+n], s.seed, seq, s.me, j)
		off += n
	}
	if s.inject && off > 0 {
		s.send[off/2] ^= 0x5a
		s.inject = false
	}
	return s.send[:off]
}

// checkRecv checks recv block by block against what each rank sends this
// one by counts.
func (s *rankState) checkRecv(name string, seq int64, recv []byte, counts []int) error {
	off := 0
	for i, n := range counts {
		pattern(s.want[:n], s.seed, seq, i, s.me)
		if err := check(fmt.Sprintf("%s: block from rank %d", name, i), recv[off:off+n], s.want[:n]); err != nil {
			return err
		}
		off += n
	}
	if off != len(recv) {
		return wrong("%s: received %d bytes, counts add up to %d", name, len(recv), off)
	}
	s.bytes += int64(off)
	return nil
}

func sum(v []int) int {
	t := 0
	for _, x := range v {
		t += x
	}
	return t
}

func (s *rankState) allToAll(ctx context.Context, rng *rand.Rand, seq int64) error {
	b := sizeOf(rng, maxBlock)
	for j := range s.p {
		s.sendCounts[j], s.recvCounts[j] = b, b
	}
	send := s.fillSend(seq)
	recv := s.recv[:len(send)]
	if err := s.c.AllToAll(ctx, send, recv); err != nil {
		return err
	}
	return s.checkRecv("alltoall", seq, recv, s.recvCounts)
}

func (s *rankState) allToAllV(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawMatrix(rng)
	send := s.fillSend(seq)
	recv := s.recv[:sum(s.recvCounts)]
	if err := s.c.AllToAllV(ctx, send, s.sendCounts, recv, s.recvCounts); err != nil {
		return err
	}
	return s.checkRecv("alltoallv", seq, recv, s.recvCounts)
}

func (s *rankState) allToAllVMatrix(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawMatrix(rng)
	send := s.fillSend(seq)
	recv := s.recv[:sum(s.recvCounts)]
	if err := s.c.AllToAllVMatrix(ctx, send, recv, s.matrix); err != nil {
		return err
	}
	return s.checkRecv("alltoallv-matrix", seq, recv, s.recvCounts)
}

func (s *rankState) allToAllVInBand(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawMatrix(rng)
	send := s.fillSend(seq)
	want := slices.Clone(s.recvCounts)
	recv := s.recv[:sum(want)]
	clear(s.recvCounts)
	if err := s.c.AllToAllVInBand(ctx, send, s.sendCounts, recv, s.recvCounts); err != nil {
		return err
	}
	if !slices.Equal(s.recvCounts, want) {
		return wrong("alltoallv-inband: learned counts %v, want %v", s.recvCounts, want)
	}
	return s.checkRecv("alltoallv-inband", seq, recv, s.recvCounts)
}

func (s *rankState) exchangeCounts(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawMatrix(rng)
	got, err := s.c.ExchangeCounts(ctx, s.sendCounts)
	if err != nil {
		return err
	}
	if !slices.Equal(got, s.recvCounts) {
		return wrong("exchangecounts: got %v, want %v", got, s.recvCounts)
	}
	send := s.fillSend(seq)
	recv := s.recv[:sum(got)]
	if err := s.c.AllToAllV(ctx, send, s.sendCounts, recv, got); err != nil {
		return err
	}
	return s.checkRecv("exchangecounts+alltoallv", seq, recv, got)
}

func (s *rankState) exchangeCountsMatrix(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawMatrix(rng)
	want := slices.Clone(s.matrix)
	recvCounts := make([]int, s.p)
	clear(s.matrix)
	if err := s.c.ExchangeCountsMatrix(ctx, s.sendCounts, recvCounts, s.matrix); err != nil {
		return err
	}
	if !slices.Equal(s.matrix, want) || !slices.Equal(recvCounts, s.recvCounts) {
		return wrong("exchangecountsmatrix: matrix %v, want %v", s.matrix, want)
	}
	send := s.fillSend(seq)
	recv := s.recv[:sum(recvCounts)]
	if err := s.c.AllToAllVMatrix(ctx, send, recv, s.matrix); err != nil {
		return err
	}
	return s.checkRecv("exchangecountsmatrix+alltoallv-matrix", seq, recv, recvCounts)
}

// elems draws a buffer length in whole elements of dt, at most limit bytes.
func elems(rng *rand.Rand, dt a2a.DType, limit int) int {
	n := sizeOf(rng, limit)
	return n / dt.Size() * dt.Size()
}

func (s *rankState) allReduce(ctx context.Context, rng *rand.Rand, seq int64) error {
	r := drawReduction(rng)
	n := elems(rng, r.dt, 2*maxBlock)
	inPlace := rng.IntN(4) == 0
	send, recv := s.send[:n], s.recv[:n]
	values(send, r.dt, s.seed, seq, s.me)
	if inPlace {
		copy(recv, send)
		send = recv
	}
	if err := s.c.AllReduce(ctx, send, recv, r.dt, r.op); err != nil {
		return err
	}
	if err := reduced(s.want[:n], s.scratch[:n], r, s.seed, seq, s.p); err != nil {
		return err
	}
	s.bytes += int64(n)
	return check(fmt.Sprintf("allreduce %v %v in-place=%v", r.dt, r.op, inPlace), recv, s.want[:n])
}

func (s *rankState) reduceScatter(ctx context.Context, rng *rand.Rand, seq int64) error {
	r := drawReduction(rng)
	b := elems(rng, r.dt, maxBlock)
	send, recv := s.send[:s.p*b], s.recv[:b]
	values(send, r.dt, s.seed, seq, s.me)
	if err := s.c.ReduceScatter(ctx, send, recv, r.dt, r.op); err != nil {
		return err
	}
	want, scratch := s.want[:s.p*b], s.scratch[:s.p*b]
	if err := reduced(want, scratch, r, s.seed, seq, s.p); err != nil {
		return err
	}
	s.bytes += int64(b)
	return check(fmt.Sprintf("reducescatter %v %v", r.dt, r.op), recv, want[s.me*b:(s.me+1)*b])
}

func (s *rankState) reduceOp(ctx context.Context, rng *rand.Rand, seq int64) error {
	r := drawReduction(rng)
	n := elems(rng, r.dt, maxBlock)
	root := rng.IntN(s.p)
	send, recv := s.send[:n], s.recv[:n]
	values(send, r.dt, s.seed, seq, s.me)
	if err := s.c.Reduce(ctx, send, recv, r.dt, r.op, root); err != nil {
		return err
	}
	if s.me != root {
		return nil
	}
	if err := reduced(s.want[:n], s.scratch[:n], r, s.seed, seq, s.p); err != nil {
		return err
	}
	s.bytes += int64(n)
	return check(fmt.Sprintf("reduce %v %v root %d", r.dt, r.op, root), recv, s.want[:n])
}

func (s *rankState) allGather(ctx context.Context, rng *rand.Rand, seq int64) error {
	b := sizeOf(rng, maxBlock)
	for i := range s.p {
		s.recvCounts[i] = b
	}
	send, recv := s.send[:b], s.recv[:s.p*b]
	pattern(send, s.seed, seq, s.me, -1)
	if err := s.c.AllGather(ctx, send, recv); err != nil {
		return err
	}
	return s.checkGathered("allgather", seq, recv, s.recvCounts)
}

// checkGathered checks blocks that every rank sent to all (dst -1).
func (s *rankState) checkGathered(name string, seq int64, recv []byte, counts []int) error {
	off := 0
	for i, n := range counts {
		pattern(s.want[:n], s.seed, seq, i, -1)
		if err := check(fmt.Sprintf("%s: block of rank %d", name, i), recv[off:off+n], s.want[:n]); err != nil {
			return err
		}
		off += n
	}
	s.bytes += int64(off)
	return nil
}

// drawCounts gives every rank a size of its own (rank i's in s.recvCounts[i]).
func (s *rankState) drawCounts(rng *rand.Rand) {
	for i := range s.p {
		s.recvCounts[i] = sizeOf(rng, maxBlock)
	}
}

func (s *rankState) allGatherV(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawCounts(rng)
	send, recv := s.send[:s.recvCounts[s.me]], s.recv[:sum(s.recvCounts)]
	pattern(send, s.seed, seq, s.me, -1)
	if err := s.c.AllGatherV(ctx, send, recv, s.recvCounts); err != nil {
		return err
	}
	return s.checkGathered("allgatherv", seq, recv, s.recvCounts)
}

func (s *rankState) broadcast(ctx context.Context, rng *rand.Rand, seq int64) error {
	n := sizeOf(rng, 2*maxBlock)
	root := rng.IntN(s.p)
	buf := s.recv[:n]
	if s.me == root {
		pattern(buf, s.seed, seq, root, -1)
	} else {
		clear(buf)
	}
	if err := s.c.Broadcast(ctx, buf, root); err != nil {
		return err
	}
	pattern(s.want[:n], s.seed, seq, root, -1)
	s.bytes += int64(n)
	return check(fmt.Sprintf("broadcast root %d", root), buf, s.want[:n])
}

func (s *rankState) gather(ctx context.Context, rng *rand.Rand, seq int64) error {
	b := sizeOf(rng, maxBlock)
	root := rng.IntN(s.p)
	for i := range s.p {
		s.recvCounts[i] = b
	}
	send, recv := s.send[:b], s.recv[:s.p*b]
	pattern(send, s.seed, seq, s.me, -1)
	if err := s.c.Gather(ctx, send, recv, root); err != nil {
		return err
	}
	if s.me != root {
		return nil
	}
	return s.checkGathered(fmt.Sprintf("gather root %d", root), seq, recv, s.recvCounts)
}

func (s *rankState) gatherV(ctx context.Context, rng *rand.Rand, seq int64) error {
	s.drawCounts(rng)
	root := rng.IntN(s.p)
	send, recv := s.send[:s.recvCounts[s.me]], s.recv[:sum(s.recvCounts)]
	pattern(send, s.seed, seq, s.me, -1)
	if err := s.c.GatherV(ctx, send, recv, s.recvCounts, root); err != nil {
		return err
	}
	if s.me != root {
		return nil
	}
	return s.checkGathered(fmt.Sprintf("gatherv root %d", root), seq, recv, s.recvCounts)
}

func (s *rankState) scatter(ctx context.Context, rng *rand.Rand, seq int64) error {
	b := sizeOf(rng, maxBlock)
	root := rng.IntN(s.p)
	for j := range s.p {
		s.sendCounts[j] = b
	}
	var send []byte
	if s.me == root {
		send = s.fillRootBlocks(seq, root)
	}
	recv := s.recv[:b]
	if err := s.c.Scatter(ctx, send, recv, root); err != nil {
		return err
	}
	pattern(s.want[:b], s.seed, seq, root, s.me)
	s.bytes += int64(b)
	return check(fmt.Sprintf("scatter root %d", root), recv, s.want[:b])
}

// fillRootBlocks writes root's block for every rank by s.sendCounts.
func (s *rankState) fillRootBlocks(seq int64, root int) []byte {
	off := 0
	for j, n := range s.sendCounts {
		pattern(s.send[off:off+n], s.seed, seq, root, j)
		off += n
	}
	return s.send[:off]
}

func (s *rankState) scatterV(ctx context.Context, rng *rand.Rand, seq int64) error {
	root := rng.IntN(s.p)
	for j := range s.p {
		s.sendCounts[j] = sizeOf(rng, maxBlock)
	}
	var send []byte
	if s.me == root {
		send = s.fillRootBlocks(seq, root)
	}
	n := s.sendCounts[s.me]
	recv := s.recv[:n]
	if err := s.c.ScatterV(ctx, send, s.sendCounts, recv, root); err != nil {
		return err
	}
	pattern(s.want[:n], s.seed, seq, root, s.me)
	s.bytes += int64(n)
	return check(fmt.Sprintf("scatterv root %d", root), recv, s.want[:n])
}

func (s *rankState) barrier(ctx context.Context, _ *rand.Rand, _ int64) error {
	return s.c.Barrier(ctx)
}

// sendRecvPairs has ranks 2k and 2k+1 exchange a message each way, the
// lower sending first (so a blocking Send always meets a posted Recv);
// a rank without a partner sits it out.
func (s *rankState) sendRecvPairs(ctx context.Context, rng *rand.Rand, seq int64) error {
	sizes := make([]int, s.p) // sizes[r]: what rank r sends its partner
	for r := range s.p {
		sizes[r] = sizeOf(rng, maxBlock)
	}
	tag := rng.IntN(1 << 20)
	peer := s.me ^ 1
	if peer >= s.p {
		return nil
	}
	send := s.send[:sizes[s.me]]
	pattern(send, s.seed, seq, s.me, peer)
	doSend := func() error { return s.c.Send(ctx, send, peer, tag) }
	doRecv := func() error { return s.recvFrom(ctx, seq, peer, sizes[peer], tag, "sendrecv-pairs") }
	first, second := doSend, doRecv
	if s.me > peer {
		first, second = doRecv, doSend
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// recvFrom receives one message of n bytes from peer and checks it.
func (s *rankState) recvFrom(ctx context.Context, seq int64, peer, n, tag int, name string) error {
	buf := s.recv[:n+rngSlack(n)]
	got, err := s.c.Recv(ctx, buf, peer, tag)
	if err != nil {
		return err
	}
	pattern(s.want[:n], s.seed, seq, peer, s.me)
	s.bytes += int64(got)
	return check(fmt.Sprintf("%s: message from rank %d tag %d", name, peer, tag), buf[:got], s.want[:n])
}

// rngSlack is room beyond the expected length, so a longer message shows as
// a wrong length rather than a library error.
func rngSlack(n int) int { return min(64, maxBlock-n) }

// sendOne has one random rank send another one message; the rest sit it out.
func (s *rankState) sendOne(ctx context.Context, rng *rand.Rand, seq int64) error {
	from := rng.IntN(s.p)
	to := (from + 1 + rng.IntN(s.p-1)) % s.p
	n := sizeOf(rng, maxBlock)
	tag := rng.IntN(1 << 20)
	switch s.me {
	case from:
		send := s.send[:n]
		pattern(send, s.seed, seq, from, to)
		return s.c.Send(ctx, send, to, tag)
	case to:
		return s.recvFrom(ctx, seq, from, n, tag, "send-one")
	}
	return nil
}
