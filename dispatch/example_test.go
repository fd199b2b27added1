package dispatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/dispatch"
	"github.com/a2a-moe/a2a/routing"
)

// One MoE step on 2 ranks (goroutines here, processes in real life) hosting 4
// experts: each rank routes its 4 tokens to 2 experts, its experts scale
// their rows by (expert id + 1), and combine returns 0.75*y0 + 0.25*y1 per
// token.
func Example() {
	nats := a2atest.NewServer() // a job: `a2ad serve` and A2A_NATS_URL
	defer nats.Close()
	const ranks, experts, hidden, tokens = 2, 4, 2, 4
	report := make([]string, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			report[r] = rank(nats.URL, r, ranks, experts, hidden, tokens)
		}()
	}
	wg.Wait()
	fmt.Print(strings.Join(report, ""))
	// Output:
	// rank 0: expert 0 got [0 3 10 13], expert 1 got [0 1 10 11]
	// rank 0: combined [0 2.25 6.5 9.75]
	// rank 1: expert 2 got [1 2 11 12], expert 3 got [2 3 12 13]
	// rank 1: combined [12.5 24.75 39 42.25]
}

func rank(url string, r, ranks, experts, hidden, tokens int) string {
	ctx := context.Background()
	c, err := a2a.Join(ctx, a2a.Config{NATSURL: url, Group: "example", Rank: r, WorldSize: ranks,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	d, err := dispatch.New(ctx, c, dispatch.Config{Experts: experts, K: 2, Hidden: hidden, DType: reduce.Float32})
	if err != nil {
		panic(err)
	}
	defer d.Close()

	// Token t of rank r is (10r+t, -(10r+t)); it picks experts t%4 and
	// (t+1)%4 with weights 0.75 and 0.25.
	x := make([]float32, tokens*hidden)
	ids, weights := make([]int32, tokens*2), make([]float32, tokens*2)
	for t := range tokens {
		v := float32(10*r + t)
		x[t*hidden], x[t*hidden+1] = v, -v
		ids[2*t], ids[2*t+1] = int32(t%experts), int32((t+1)%experts)
		weights[2*t], weights[2*t+1] = 0.75, 0.25
	}
	var dec routing.Decision
	if err := routing.FromAssignments(ids, weights, tokens, 2, experts, &dec); err != nil {
		panic(err)
	}
	h, err := d.Dispatch(ctx, reduce.AsBytes(x), &dec)
	if err != nil {
		panic(err)
	}
	defer h.Release()

	var sb strings.Builder
	fmt.Fprintf(&sb, "rank %d:", r)
	in, out := h.Recv(), h.Output()
	for l := range h.LocalExperts() {
		e := h.Expert(l)
		var got []float32
		for _, seg := range h.Segments(l) {
			span := seg.Offset + seg.Rows*d.RowBytes()
			x, err := reduce.Float32s(in[seg.Offset:span]) // views: no copies
			if err != nil {
				panic(err)
			}
			y, err := reduce.Float32s(out[seg.Offset:span])
			if err != nil {
				panic(err)
			}
			for i, v := range x {
				if i%hidden == 0 {
					got = append(got, v)
				}
				y[i] = float32(e+1) * v // the expert
			}
		}
		if l > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, " expert %d got %v", e, got)
	}
	combined := make([]float32, tokens*hidden)
	if err := d.Combine(ctx, h, out, reduce.AsBytes(combined)); err != nil {
		panic(err)
	}
	firsts := make([]float32, tokens)
	for t := range firsts {
		firsts[t] = combined[t*hidden]
	}
	fmt.Fprintf(&sb, "\nrank %d: combined %v\n", r, firsts)
	return sb.String()
}
