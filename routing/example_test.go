package routing_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/a2a-moe/a2a/routing"
)

// One MoE step for 8 tokens, top-2 of 4 experts spread over 2 ranks: route,
// enforce capacity, plan the send buffer, then pack rows for the all-to-all.
func Example() {
	const tokens, experts, ranks, k, hidden = 8, 4, 2, 2, 3
	r := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, tokens*experts)
	if err := routing.SkewedLogits(r, tokens, experts, 1.5, logits); err != nil {
		panic(err)
	}

	var d routing.Decision
	if err := (routing.Gate{Experts: experts, K: k}).Route(logits, tokens, &d); err != nil {
		panic(err)
	}
	c := routing.Capacity{Factor: 1}
	dropped, err := c.Apply(&d, experts, nil)
	if err != nil {
		panic(err)
	}
	pl, err := routing.Contiguous(experts, ranks)
	if err != nil {
		panic(err)
	}
	var p routing.Plan
	if err := p.Build(&d, pl); err != nil {
		panic(err)
	}
	fmt.Println("capacity per expert:", c.PerExpert(tokens, k, experts), "dropped:", dropped)
	fmt.Printf("rows per rank: %v imbalance: %.2f\n", p.RankRows, routing.Imbalance(p.RankRows))
	for rank := range ranks {
		fmt.Printf("rank %d local expert rows: %v\n", rank, p.LocalRows(rank, nil))
	}

	// Rows travel as bytes; each token row here is hidden bytes wide.
	src := make([]byte, tokens*hidden)
	for i := range src {
		src[i] = byte(i / hidden) // every byte of a row holds its token index
	}
	send := make([]byte, p.Rows*hidden)
	if err := p.Pack(send, src, hidden); err != nil {
		panic(err)
	}
	for rank := range ranks {
		seg := send[p.RankStart[rank]*hidden : p.RankStart[rank+1]*hidden]
		fmt.Printf("tokens sent to rank %d:", rank)
		for i := 0; i < len(seg); i += hidden {
			fmt.Printf(" %d", seg[i])
		}
		fmt.Println()
	}
	// Output:
	// capacity per expert: 4 dropped: 3
	// rows per rank: [8 5] imbalance: 1.23
	// rank 0 local expert rows: [4 4]
	// rank 1 local expert rows: [3 2]
	// tokens sent to rank 0: 0 1 2 6 0 3 5 7
	// tokens sent to rank 1: 1 4 6 2 7
}

// Balance re-places 8 experts with skewed loads over 4 ranks on 2 hosts,
// with one redundant slot per rank. Each host gets four whole experts; within
// a host the heaviest get a second replica, on the other rank.
func ExampleBalance() {
	load := []float64{40, 20, 10, 8, 6, 4, 2, 2} // tokens per expert
	before, err := routing.Contiguous(len(load), 4)
	if err != nil {
		panic(err)
	}
	pl, err := routing.Balance(load, 4, 2, 12) // 4 ranks, 2 per host, 12 slots
	if err != nil {
		panic(err)
	}
	for _, p := range []*routing.Placement{before, pl} {
		rl, err := p.RankLoad(load)
		if err != nil {
			panic(err)
		}
		fmt.Printf("rank loads %v max/mean %.2f\n", rl, routing.Imbalance(rl))
	}
	for r := range pl.Ranks {
		spr := pl.SlotsPerRank()
		fmt.Printf("rank %d slots:", r)
		for s := r * spr; s < (r+1)*spr; s++ {
			fmt.Printf(" %d", pl.SlotExpert(s))
		}
		fmt.Println()
	}
	fmt.Println("replicas of expert 0:", pl.Replicas(0))
	// Output:
	// rank loads [60 18 10 4] max/mean 2.61
	// rank loads [24 24 23 21] max/mean 1.04
	// rank 0 slots: 0 5 6
	// rank 1 slots: 0 5 7
	// rank 2 slots: 1 2 3
	// rank 3 slots: 1 2 4
	// replicas of expert 0: [0 3]
}
