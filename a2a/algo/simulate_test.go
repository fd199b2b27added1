package algo

import (
	"errors"
	"strings"
	"testing"
)

// uniformSetup plans a p-rank pairwise exchange of n bytes per pair and
// returns the schedules with matching buffers.
func uniformSetup(t *testing.T, plan planFunc, p, n, block int) ([]*Schedule, [][]byte, [][]byte) {
	t.Helper()
	m := make([]int, p*p)
	for i := range m {
		m[i] = n
	}
	scheds := make([]*Schedule, p)
	send, recv := make([][]byte, p), make([][]byte, p)
	for r := range p {
		scheds[r] = new(Schedule)
		if err := plan(scheds[r], argsFor(m, p, r, 1, 0, block)); err != nil {
			t.Fatal(err)
		}
		send[r], recv[r] = make([]byte, p*n), make([]byte, p*n)
	}
	return scheds, send, recv
}

// build makes a schedule from rounds of steps.
func build(a Algo, rounds ...[]Step) *Schedule {
	s := &Schedule{Algo: a}
	for _, rd := range rounds {
		for _, st := range rd {
			s.Add(st)
		}
		s.EndRound()
	}
	return s
}

func sendStep(peer, off, n int, last bool) Step {
	return Step{Kind: StepSend, Peer: peer, Src: Span{BufSend, off, n}, Last: last}
}

func recvStep(peer, off, n int, last bool) Step {
	return Step{Kind: StepRecv, Peer: peer, Dst: Span{BufRecv, off, n}, Last: last}
}

func TestSimulateRejects(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) ([]*Schedule, [][]byte, [][]byte)
		kind  error
		want  []string // substrings of the error
	}{
		{
			name: "wrong peer deadlocks",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanPairwise, 4, 10, 0)
				rd := s[1].Round(0)[1:] // rank 1 first exchange (after the copy): send to 2 -> send to 3
				if rd[0].Kind != StepSend || rd[0].Peer != 2 {
					t.Fatalf("unexpected round: %v", rd)
				}
				rd[0].Peer = 3
				return s, snd, rcv
			},
			kind: ErrDeadlock,
			want: []string{"rank 2 in round 0/3 waits for receive of frame 0 from 1", "unmatched: rank 1 posts only 0 sends"},
		},
		{
			name: "wrong length",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanFullmesh, 3, 10, 0)
				rd := s[2].Round(0)
				for i := range rd {
					if rd[i].Kind == StepRecv {
						rd[i].Dst.Len = 9
						break
					}
				}
				return s, snd, rcv
			},
			kind: ErrMismatch,
			want: []string{"sends 10 bytes", "expects 9 bytes"},
		},
		{
			name: "last flag disagreement",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				return []*Schedule{
						build(AlgoPairwise, []Step{sendStep(1, 0, 4, true)}),
						build(AlgoPairwise, []Step{recvStep(0, 0, 4, false)}),
					},
					[][]byte{make([]byte, 4), nil}, [][]byte{nil, make([]byte, 4)}
			},
			kind: ErrMismatch,
			want: []string{"last=true", "last=false"},
		},
		{
			name: "unbuffered send-first deadlocks",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				// Fine with an eager transport, a hang with rendezvous.
				return []*Schedule{
						build(AlgoPairwise, []Step{sendStep(1, 0, 4, true)}, []Step{recvStep(1, 0, 4, true)}),
						build(AlgoPairwise, []Step{sendStep(0, 0, 4, true)}, []Step{recvStep(0, 0, 4, true)}),
					},
					[][]byte{make([]byte, 4), make([]byte, 4)}, [][]byte{make([]byte, 4), make([]byte, 4)}
			},
			kind: ErrDeadlock,
			want: []string{"ranks [0 1]", "rank 1 is in round 0, posts the matching receive in round 1"},
		},
		{
			name: "out of bounds",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanPairwise, 3, 10, 0)
				rcv[1] = rcv[1][:25]
				return s, snd, rcv
			},
			kind: ErrBadSchedule,
			want: []string{"rank 1", "out of bounds (buffer has 25 bytes)"},
		},
		{
			name: "missing EndRound",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanPairwise, 2, 10, 0)
				s[0].Add(sendStep(1, 0, 1, true))
				return s, snd, rcv
			},
			kind: ErrBadSchedule,
			want: []string{"belong to no round"},
		},
		{
			name: "overlapping writes in a round",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				return []*Schedule{
						build(AlgoFullmesh, []Step{recvStep(1, 0, 6, true), recvStep(2, 4, 4, true)}),
						build(AlgoFullmesh, []Step{sendStep(0, 0, 6, true)}),
						build(AlgoFullmesh, []Step{sendStep(0, 0, 4, true)}),
					},
					[][]byte{nil, make([]byte, 6), make([]byte, 4)}, [][]byte{make([]byte, 8), nil, nil}
			},
			kind: ErrBadSchedule,
			want: []string{"overlapping bytes of the recv buffer"},
		},
		{
			name: "copy races a receive",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				cp := Step{Kind: StepCopy, Src: Span{BufSend, 0, 4}, Dst: Span{BufScratch, 2, 4}}
				s0 := build(AlgoFullmesh, []Step{{Kind: StepRecv, Peer: 1, Dst: Span{BufScratch, 0, 3}, Last: true}, cp})
				s0.ScratchBytes = 8
				return []*Schedule{s0, build(AlgoFullmesh, []Step{sendStep(0, 0, 3, true)})},
					[][]byte{make([]byte, 4), make([]byte, 3)}, [][]byte{nil, nil}
			},
			kind: ErrBadSchedule,
			want: []string{"scratch buffer"},
		},
		{
			name: "write to send buffer",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				return []*Schedule{build(AlgoPairwise, []Step{{Kind: StepCopy, Src: Span{BufSend, 0, 2}, Dst: Span{BufSend, 2, 2}}})},
					[][]byte{make([]byte, 4)}, [][]byte{nil}
			},
			kind: ErrBadSchedule,
			want: []string{"writes the caller's send buffer"},
		},
		{
			name: "reduce unsupported",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				return []*Schedule{build(AlgoRing, []Step{{Kind: StepReduce, Src: Span{BufSend, 0, 2}, Dst: Span{BufRecv, 0, 2}}})},
					[][]byte{make([]byte, 2)}, [][]byte{make([]byte, 2)}
			},
			kind: ErrBadSchedule,
			want: []string{"not supported"},
		},
		{
			name: "peer out of range",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				return []*Schedule{build(AlgoPairwise, []Step{sendStep(1, 0, 0, true)})}, [][]byte{nil}, [][]byte{nil}
			},
			kind: ErrBadSchedule,
			want: []string{"peer 1 out of range"},
		},
		{
			name: "different algorithms",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanPairwise, 3, 4, 0)
				var f Schedule
				if err := PlanFullmesh(&f, argsFor([]int{4, 4, 4, 4, 4, 4, 4, 4, 4}, 3, 2, 1, 0, 0)); err != nil {
					t.Fatal(err)
				}
				s[2] = &f
				return s, snd, rcv
			},
			kind: ErrMismatch,
			want: []string{"rank 2 runs fullmesh, rank 0 runs pairwise"},
		},
		{
			name: "buffer count",
			setup: func(t *testing.T) ([]*Schedule, [][]byte, [][]byte) {
				s, snd, rcv := uniformSetup(t, PlanPairwise, 3, 4, 0)
				return s, snd[:2], rcv
			},
			kind: ErrBadSchedule,
			want: []string{"3 schedules, 2 send buffers"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, snd, rcv := tt.setup(t)
			err := Simulate(s, snd, rcv)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("Simulate = %v, want %v", err, tt.kind)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestSimulateLeftoverFrame: a sender with one frame more than its receiver
// expects leaves the sender stuck; the report names the unmatched frame.
func TestSimulateLeftoverFrame(t *testing.T) {
	s := []*Schedule{
		build(AlgoPairwise, []Step{sendStep(1, 0, 2, true)}, []Step{sendStep(1, 2, 2, true)}),
		build(AlgoPairwise, []Step{recvStep(0, 0, 2, true)}),
	}
	err := Simulate(s, [][]byte{make([]byte, 4), nil}, [][]byte{nil, make([]byte, 2)})
	if !errors.Is(err, ErrDeadlock) {
		t.Fatalf("Simulate = %v, want ErrDeadlock", err)
	}
	for _, w := range []string{"ranks [0]", "send of frame 1 to 1", "rank 1 posts only 1 receives"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// TestSimulateMovesBytes checks a handcrafted multi-round schedule with
// scratch staging, including that rendezvous completes a chain of rounds.
func TestSimulateMovesBytes(t *testing.T) {
	// Rank 0 sends "abcd" to rank 1, which stages it in scratch and forwards
	// "cd" to rank 2 in the next round.
	s1 := build(AlgoStaged,
		[]Step{{Kind: StepRecv, Peer: 0, Dst: Span{BufScratch, 0, 4}, Last: true}},
		[]Step{{Kind: StepSend, Peer: 2, Src: Span{BufScratch, 2, 2}, Last: true},
			{Kind: StepCopy, Src: Span{BufScratch, 0, 2}, Dst: Span{BufRecv, 0, 2}}},
	)
	s1.ScratchBytes = 4
	s := []*Schedule{
		build(AlgoStaged, []Step{sendStep(1, 0, 4, true)}),
		s1,
		build(AlgoStaged, []Step{recvStep(1, 1, 2, true)}),
	}
	send := [][]byte{[]byte("abcd"), nil, nil}
	recv := [][]byte{nil, make([]byte, 2), []byte("xxx")}
	if err := Simulate(s, send, recv); err != nil {
		t.Fatal(err)
	}
	if string(recv[1]) != "ab" || string(recv[2]) != "xcd" {
		t.Fatalf("recv = %q, %q; want \"ab\", \"xcd\"", recv[1], recv[2])
	}
}

// TestSimulateSelfSend: a rank may exchange with itself within one round
// (planners use a copy instead, but the simulator does not forbid it).
func TestSimulateSelfSend(t *testing.T) {
	s := []*Schedule{build(AlgoDirect, []Step{recvStep(0, 0, 3, true), sendStep(0, 1, 3, true)})}
	recv := [][]byte{make([]byte, 3)}
	if err := Simulate(s, [][]byte{[]byte("wxyz")}, recv); err != nil {
		t.Fatal(err)
	}
	if string(recv[0]) != "xyz" {
		t.Fatalf("recv = %q, want \"xyz\"", recv[0])
	}
	// In two rounds, receive first, it can never complete.
	s = []*Schedule{build(AlgoDirect, []Step{recvStep(0, 0, 3, true)}, []Step{sendStep(0, 1, 3, true)})}
	if err := Simulate(s, [][]byte{[]byte("wxyz")}, recv); !errors.Is(err, ErrDeadlock) {
		t.Fatalf("Simulate = %v, want ErrDeadlock", err)
	}
}
