package algo

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/a2a-moe/a2a/a2a/reduce"
)

func int32s(vs ...int32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}

// reduceSched is build for an int32 Sum schedule with scratch.
func reduceSched(scratch int, rounds ...[]Step) *Schedule {
	s := build(AlgoRing, rounds...)
	s.DType, s.Op, s.ElemSize, s.ScratchBytes = uint8(reduce.Int32), uint8(reduce.Sum), 4, scratch
	return s
}

func rr(peer int, land, dst Span, last bool) Step {
	return Step{Kind: StepRecvReduce, Peer: peer, Src: land, Dst: dst, Last: last}
}

// TestSimulateRecvReduce checks that a RecvReduce lands its frames in
// scratch and reduces each into its destination, and that a local Reduce
// runs at its round's start.
func TestSimulateRecvReduce(t *testing.T) {
	s0 := reduceSched(0, []Step{sendStep(1, 0, 8, false), sendStep(1, 8, 4, true)})
	s1 := reduceSched(12,
		[]Step{{Kind: StepCopy, Src: Span{BufSend, 0, 12}, Dst: Span{BufRecv, 0, 12}}},
		[]Step{rr(0, Span{BufScratch, 0, 8}, Span{BufRecv, 0, 8}, false), rr(0, Span{BufScratch, 8, 4}, Span{BufRecv, 8, 4}, true)},
		[]Step{{Kind: StepReduce, Src: Span{BufRecv, 0, 4}, Dst: Span{BufRecv, 8, 4}}},
	)
	send := [][]byte{int32s(1, 2, 3), int32s(10, 20, 30)}
	recv := [][]byte{nil, make([]byte, 12)}
	if err := SimulateWith([]*Schedule{s0, s1}, send, recv, testReducer); err != nil {
		t.Fatal(err)
	}
	// Element 2: 30 + 3 received, then + 11 from the local reduce.
	if want := int32s(11, 22, 33+11); string(recv[1]) != string(want) {
		t.Fatalf("recv = %v, want %v", recv[1], want)
	}
}

func TestSimulateReduceRejects(t *testing.T) {
	two := func(s0, s1 *Schedule) []*Schedule { return []*Schedule{s0, s1} }
	tests := []struct {
		name   string
		scheds []*Schedule
		send   [][]byte
		recv   [][]byte
		kind   error
		want   []string
	}{
		{
			// The classic exchange bug: reducing into the buffer still being sent.
			name: "recvreduce into the buffer being sent",
			scheds: two(
				reduceSched(4, []Step{{Kind: StepSend, Peer: 1, Src: Span{BufRecv, 0, 4}, Last: true}, rr(1, Span{BufScratch, 0, 4}, Span{BufRecv, 0, 4}, true)}),
				reduceSched(4, []Step{{Kind: StepSend, Peer: 0, Src: Span{BufRecv, 0, 4}, Last: true}, rr(0, Span{BufScratch, 0, 4}, Span{BufRecv, 0, 4}, true)})),
			send: [][]byte{nil, nil}, recv: [][]byte{make([]byte, 4), make([]byte, 4)},
			kind: ErrBadSchedule, want: []string{"overlapping bytes of the recv buffer"},
		},
		{
			name: "landing shared by two receives",
			scheds: two(
				reduceSched(4, []Step{rr(1, Span{BufScratch, 0, 4}, Span{BufRecv, 0, 4}, true), {Kind: StepRecv, Peer: 1, Dst: Span{BufScratch, 0, 4}, Last: true}}),
				reduceSched(0, []Step{sendStep(0, 0, 4, true), sendStep(0, 0, 4, true)})),
			send: [][]byte{nil, make([]byte, 4)}, recv: [][]byte{make([]byte, 4), nil},
			kind: ErrBadSchedule, want: []string{"scratch buffer"},
		},
		{
			name:   "length mismatch",
			scheds: []*Schedule{reduceSched(0, []Step{{Kind: StepReduce, Src: Span{BufSend, 0, 4}, Dst: Span{BufRecv, 0, 8}}})},
			send:   [][]byte{make([]byte, 8)}, recv: [][]byte{make([]byte, 8)},
			kind: ErrBadSchedule, want: []string{"reduces 4 bytes into 8"},
		},
		{
			name:   "partial element",
			scheds: []*Schedule{reduceSched(0, []Step{{Kind: StepReduce, Src: Span{BufSend, 0, 6}, Dst: Span{BufRecv, 0, 6}}})},
			send:   [][]byte{make([]byte, 8)}, recv: [][]byte{make([]byte, 8)},
			kind: ErrBadSchedule, want: []string{"not a multiple of the 4-byte element"},
		},
		{
			name:   "reduce into send",
			scheds: []*Schedule{reduceSched(0, []Step{{Kind: StepReduce, Src: Span{BufRecv, 0, 4}, Dst: Span{BufSend, 0, 4}}})},
			send:   [][]byte{make([]byte, 8)}, recv: [][]byte{make([]byte, 8)},
			kind: ErrBadSchedule, want: []string{"writes the caller's send buffer"},
		},
		{
			name: "landing length disagrees with the frame",
			scheds: two(reduceSched(0, []Step{sendStep(1, 0, 8, true)}),
				reduceSched(4, []Step{rr(0, Span{BufScratch, 0, 4}, Span{BufRecv, 0, 4}, true)})),
			send: [][]byte{make([]byte, 8), nil}, recv: [][]byte{nil, make([]byte, 4)},
			kind: ErrMismatch, want: []string{"sends 8 bytes", "expects 4 bytes"},
		},
		{
			name: "ranks reduce different dtypes",
			scheds: func() []*Schedule {
				s1 := reduceSched(0, []Step{recvStep(0, 0, 4, true)})
				s1.DType = uint8(reduce.Float32)
				return two(reduceSched(0, []Step{sendStep(1, 0, 4, true)}), s1)
			}(),
			send: [][]byte{make([]byte, 4), nil}, recv: [][]byte{nil, make([]byte, 4)},
			kind: ErrMismatch, want: []string{"rank 1 reduces dtype 1"},
		},
		{
			name: "kernel error",
			scheds: func() []*Schedule {
				s := reduceSched(0, []Step{{Kind: StepReduce, Src: Span{BufSend, 0, 4}, Dst: Span{BufRecv, 0, 4}}})
				s.DType = 0
				return []*Schedule{s}
			}(),
			send: [][]byte{make([]byte, 4)}, recv: [][]byte{make([]byte, 4)},
			kind: reduce.ErrInvalidArgument, want: []string{"malformed schedule", "invalid dtype"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := SimulateWith(tt.scheds, tt.send, tt.recv, testReducer)
			if !errors.Is(err, tt.kind) {
				t.Fatalf("SimulateWith = %v, want %v", err, tt.kind)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestSimulateAliasing: with one slice passed as both send and recv, a copy
// of bytes onto themselves is the no-op an in-place call relies on, while a
// write to recv that a concurrent send reads through send is a conflict the
// buffer names alone would hide.
func TestSimulateAliasing(t *testing.T) {
	one := []byte("abcdefgh")
	noop := build(AlgoRing, []Step{
		{Kind: StepCopy, Src: Span{BufSend, 0, 8}, Dst: Span{BufRecv, 0, 8}},
		sendStep(1, 0, 8, true),
	})
	peer := build(AlgoRing, []Step{recvStep(0, 0, 8, true)})
	recv1 := make([]byte, 8)
	if err := Simulate([]*Schedule{noop, peer}, [][]byte{one, nil}, [][]byte{one, recv1}); err != nil {
		t.Fatal(err)
	}
	if string(recv1) != "abcdefgh" {
		t.Fatalf("recv = %q", recv1)
	}

	race := build(AlgoRing, []Step{
		sendStep(1, 0, 4, true),
		{Kind: StepRecv, Peer: 1, Dst: Span{BufRecv, 2, 4}, Last: true},
	})
	back := build(AlgoRing, []Step{recvStep(0, 0, 4, true), sendStep(0, 0, 4, true)})
	buf := make([]byte, 8)
	err := Simulate([]*Schedule{race, back}, [][]byte{buf, make([]byte, 4)}, [][]byte{buf, make([]byte, 4)})
	if !errors.Is(err, ErrBadSchedule) || !strings.Contains(err.Error(), "the send and recv buffers (aliased)") {
		t.Fatalf("Simulate = %v, want an aliasing conflict", err)
	}
	// The same schedule on distinct buffers is fine.
	if err := Simulate([]*Schedule{race, back}, [][]byte{make([]byte, 8), make([]byte, 4)}, [][]byte{make([]byte, 8), make([]byte, 4)}); err != nil {
		t.Fatal(err)
	}
}
