package a2a_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// A MoE step overlaps its token exchange with other work: IAllToAllV
// returns at once, the exchange runs while the rank computes, and Wait
// returns its error. Two ranks swap two bytes each.
func ExampleComm_IAllToAllV() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 2
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example-i", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			r := byte(c.Rank())
			send, recv := []byte{10*r + 0, 10*r + 1}, make([]byte, 2)
			counts := []int{1, 1}
			q := c.IAllToAllV(ctx, send, counts, recv, counts)
			busy := 0 // the work the exchange overlaps
			for i := range 1000 {
				busy += i
			}
			if _, err := q.Wait(ctx); err != nil {
				panic(err)
			}
			got[c.Rank()] = fmt.Sprintf("rank %d: %v", c.Rank(), recv)
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0: [0 10]
	// rank 1: [1 11]
}

// A decode loop repeats one exchange with fixed counts: AllReduceInit (or
// AllToAllVInit) plans it once, and each step is a Start and a Wait over the
// same buffers, with new contents.
func ExamplePersistent() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 2
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example-p", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			x := []float32{0}
			buf := reduce.AsBytes(x)
			p, err := c.AllReduceInit(buf, buf, reduce.Float32, reduce.Sum)
			if err != nil {
				panic(err)
			}
			defer p.Close()
			var sums []float32
			for step := range 3 {
				x[0] = float32(step * (c.Rank() + 1))
				if err := p.Start(ctx); err != nil {
					panic(err)
				}
				if err := p.Wait(ctx); err != nil {
					panic(err)
				}
				sums = append(sums, x[0])
			}
			got[c.Rank()] = fmt.Sprintf("rank %d: %v", c.Rank(), sums)
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0: [0 3 6]
	// rank 1: [0 3 6]
}
