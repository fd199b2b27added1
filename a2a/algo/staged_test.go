package algo

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// stagedLayouts maps rank -> host for H hosts of L ranks in three ways.
func stagedLayouts(h, l int, rng *rand.Rand) map[string][]int {
	w := h * l
	contiguous, interleaved, shuffled := make([]int, w), make([]int, w), make([]int, w)
	for r := range w {
		contiguous[r] = 100 + r/l // host ids need not be 0-based
		interleaved[r] = r % h
	}
	perm := rng.Perm(w)
	for r := range w {
		shuffled[perm[r]] = r / l
	}
	return map[string][]int{"contiguous": contiguous, "interleaved": interleaved, "shuffled": shuffled}
}

func TestStagedProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	shapes := [][2]int{{1, 1}, {1, 4}, {2, 1}, {2, 2}, {3, 2}, {4, 2}, {2, 3}, {3, 3}, {5, 2}}
	cases := 0
	for _, hl := range shapes {
		h, l := hl[0], hl[1]
		w := h * l
		scheds := make([]*Schedule, w)
		for i := range scheds {
			scheds[i] = &Schedule{}
		}
		for name, hosts := range stagedLayouts(h, l, rng) {
			for trial := range 25 {
				m := randomMatrix(rng, w, 300, []float64{0, 0.3, 1}[trial%3])
				block := []int{0, 7, 64}[trial%3]
				streams := 1 + trial%2
				send, recv := make([][]byte, w), make([][]byte, w)
				for r := range w {
					a := StagedArgs{Rank: r, World: w, Matrix: m, Hosts: hosts, Streams: streams, BlockSize: block}
					if err := PlanStaged(scheds[r], a); err != nil {
						t.Fatalf("%dx%d %s: %v", h, l, name, err)
					}
					send[r], recv[r] = stagedBuffers(m, w, r)
				}
				if err := Simulate(scheds, send, recv); err != nil {
					t.Fatalf("%dx%d %s trial %d: %v", h, l, name, trial, err)
				}
				for r := range w {
					if err := checkStagedRecv(m, w, r, recv[r]); err != nil {
						t.Fatalf("%dx%d %s trial %d rank %d: %v", h, l, name, trial, r, err)
					}
				}
				cases++
			}
		}
	}
	t.Logf("%d staged cases", cases)
}

func stagedBuffers(m []int, w, r int) (send, recv []byte) {
	st, rt := 0, 0
	for j := range w {
		st += m[r*w+j]
		rt += m[j*w+r]
	}
	send, recv = make([]byte, st), make([]byte, rt)
	off := 0
	for j := range w {
		for k := range m[r*w+j] {
			send[off+k] = pattern(r, j, k)
		}
		off += m[r*w+j]
	}
	for i := range recv {
		recv[i] = 0xEE
	}
	return send, recv
}

func checkStagedRecv(m []int, w, r int, recv []byte) error {
	off := 0
	for i := range w {
		for k := range m[i*w+r] {
			if recv[off+k] != pattern(i, r, k) {
				return fmt.Errorf("byte %d from rank %d wrong", k, i)
			}
		}
		off += m[i*w+r]
	}
	return nil
}

func TestStagedMessagesPerRank(t *testing.T) {
	// 4 hosts x 2: each rank sends H-1 = 3 inter-host messages, not 6.
	const h, l = 4, 2
	w := h * l
	m := make([]int, w*w)
	for i := range m {
		m[i] = 100
	}
	hosts := make([]int, w)
	for r := range hosts {
		hosts[r] = r / l
	}
	var s Schedule
	for r := range w {
		if err := PlanStaged(&s, StagedArgs{Rank: r, World: w, Matrix: m, Hosts: hosts, Streams: 1}); err != nil {
			t.Fatal(err)
		}
		remote := map[int]bool{}
		for _, st := range s.Steps {
			if st.Kind == StepSend && hosts[st.Peer] != hosts[r] {
				remote[st.Peer] = true
			}
		}
		if len(remote) != h-1 {
			t.Fatalf("rank %d sends to %d remote ranks, want %d", r, len(remote), h-1)
		}
	}
	if n := testing.AllocsPerRun(50, func() {
		_ = PlanStaged(&s, StagedArgs{Rank: 3, World: w, Matrix: m, Hosts: hosts, Streams: 1})
	}); n != 0 {
		t.Errorf("%v allocations per re-plan", n)
	}
}

func TestStagedRejects(t *testing.T) {
	m := make([]int, 9)
	cases := []struct {
		a    StagedArgs
		want error
	}{
		{StagedArgs{Rank: 0, World: 3, Matrix: m, Hosts: []int{0, 0, 1}, Streams: 1}, ErrUnevenHosts},
		{StagedArgs{Rank: 0, World: 3, Matrix: m[:8], Hosts: []int{0, 1, 2}, Streams: 1}, nil},
		{StagedArgs{Rank: 3, World: 3, Matrix: m, Hosts: []int{0, 1, 2}, Streams: 1}, nil},
		{StagedArgs{Rank: 0, World: 3, Matrix: m, Hosts: []int{0, 1}, Streams: 1}, nil},
		{StagedArgs{Rank: 0, World: 3, Matrix: []int{0, 0, 0, 0, -1, 0, 0, 0, 0}, Hosts: []int{0, 1, 2}, Streams: 1}, nil},
	}
	for i, c := range cases {
		var s Schedule
		err := PlanStaged(&s, c.a)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("case %d: %v, want an error (%v)", i, err, c.want)
		}
	}
}
