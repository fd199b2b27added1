package a2a_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// In a job every rank is its own process: `a2ad run -n 3 -- ./prog` (or a
// launcher) starts them, `a2ad serve` runs the NATS control plane, and each
// process calls a2a.ConfigFromEnv and a2a.Join. The examples run the ranks as
// goroutines of one process instead, around an in-process NATS server
// (a2atest.NewServer), so that `go test` checks their output.

// Three ranks join a group and exchange blocks of different sizes: rank r
// sends rank j a block of j+1 bytes, each holding 10r+j. Every rank knows
// what it will receive (Rank()+1 bytes from each rank), so no counts travel
// before the data.
func ExampleJoin() {
	nats := a2atest.NewServer() // a job: `a2ad serve` and A2A_NATS_URL
	defer nats.Close()
	const size = 3
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size { // a job: one process per rank
		wg.Go(func() {
			ctx := context.Background()
			// A job: cfg, err := a2a.ConfigFromEnv()
			cfg := a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size}
			c, err := a2a.Join(ctx, cfg)
			if err != nil {
				panic(err)
			}
			defer c.Close()

			var send []byte
			sendCounts := make([]int, c.Size())
			recvCounts := make([]int, c.Size())
			for j := range c.Size() {
				sendCounts[j] = j + 1
				send = append(send, bytes.Repeat([]byte{byte(10*c.Rank() + j)}, j+1)...)
				recvCounts[j] = c.Rank() + 1
			}
			recv := make([]byte, c.Size()*(c.Rank()+1))
			if err := c.AllToAllV(ctx, send, sendCounts, recv, recvCounts); err != nil {
				panic(err)
			}
			got[c.Rank()] = fmt.Sprintf("rank %d of %d received %v", c.Rank(), c.Size(), recv)
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0 of 3 received [0 10 20]
	// rank 1 of 3 received [1 1 11 11 21 21]
	// rank 2 of 3 received [2 2 2 12 12 12 22 22 22]
}

// When only the sender knows how much it sends (MoE tokens routed to
// experts), ExchangeCounts tells every rank what it will receive before the
// AllToAllV: here rank r sends rank j (r+2j)%4 copies of the letter 'A'+r.
func ExampleComm_ExchangeCounts() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 3
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			var send []byte
			sendCounts := make([]int, c.Size())
			for j := range sendCounts {
				sendCounts[j] = (c.Rank() + 2*j) % 4
				send = append(send, bytes.Repeat([]byte{byte('A' + c.Rank())}, sendCounts[j])...)
			}
			recvCounts, err := c.ExchangeCounts(ctx, sendCounts) // over NATS
			if err != nil {
				panic(err)
			}
			total := 0
			for _, n := range recvCounts {
				total += n
			}
			recv := make([]byte, total)
			if err := c.AllToAllV(ctx, send, sendCounts, recv, recvCounts); err != nil {
				panic(err)
			}
			got[c.Rank()] = fmt.Sprintf("rank %d: counts %v, data %q", c.Rank(), recvCounts, recv)
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0: counts [0 1 2], data "BCC"
	// rank 1: counts [2 3 0], data "AABBB"
	// rank 2: counts [0 1 2], data "BCC"
}

// AllToAllVInBand learns the receive counts on the data plane, in the same
// call as the data: recv only has to be large enough. Rank r sends rank j
// the text "r>j" when r != j, and nothing to itself.
func ExampleComm_AllToAllVInBand() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 3
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			var send []byte
			sendCounts := make([]int, c.Size())
			for j := range sendCounts {
				if j != c.Rank() {
					msg := fmt.Sprintf("%d>%d ", c.Rank(), j)
					send = append(send, msg...)
					sendCounts[j] = len(msg)
				}
			}
			recv := make([]byte, 64) // an upper bound
			recvCounts := make([]int, c.Size())
			if err := c.AllToAllVInBand(ctx, send, sendCounts, recv, recvCounts); err != nil {
				panic(err)
			}
			total := 0
			for _, n := range recvCounts {
				total += n
			}
			got[c.Rank()] = fmt.Sprintf("rank %d: counts %v, data %q", c.Rank(), recvCounts, recv[:total])
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0: counts [0 4 4], data "1>0 2>0 "
	// rank 1: counts [4 0 4], data "0>1 2>1 "
	// rank 2: counts [4 4 0], data "0>2 1>2 "
}

// AllReduce works on raw bytes with an element type and an operation, for
// buffers that are bytes already (a tensor's storage); reduce.AsBytes views a
// Go slice as its bytes. Rank r contributes [r+1, 10(r+1)] as float32.
func ExampleComm_AllReduce() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 3
	got := make([]string, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			x := []float32{float32(c.Rank() + 1), float32(10 * (c.Rank() + 1))}
			buf := reduce.AsBytes(x) // the same memory as x
			if err := c.AllReduce(ctx, buf, buf, reduce.Float32, reduce.Sum); err != nil {
				panic(err)
			}
			got[c.Rank()] = fmt.Sprintf("rank %d: %v", c.Rank(), x)
		})
	}
	wg.Wait()
	fmt.Println(strings.Join(got, "\n"))
	// Output:
	// rank 0: [6 60]
	// rank 1: [6 60]
	// rank 2: [6 60]
}

// AllReduceSlice is the typed form: the element type comes from the slice.
// Four ranks average a gradient and find the largest step count.
func ExampleAllReduceSlice() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size = 4
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			grad := []float64{float64(c.Rank()), 1, -float64(c.Rank())}
			if err := a2a.AllReduceSlice(ctx, c, grad, grad, reduce.Avg); err != nil {
				panic(err)
			}
			steps := []int64{int64(100 + 7*c.Rank())}
			if err := a2a.AllReduceSlice(ctx, c, steps, steps, reduce.Max); err != nil {
				panic(err)
			}
			if c.Rank() == 0 { // every rank holds the same results
				fmt.Println("mean gradient:", grad)
				fmt.Println("max steps:", steps[0])
			}
		})
	}
	wg.Wait()
	// Output:
	// mean gradient: [1.5 1 -1.5]
	// max steps: 121
}

// AllGatherV concatenates blocks of different lengths on every rank; the
// lengths come first, from an AllGather of one int64 per rank.
func ExampleComm_AllGatherV() {
	nats := a2atest.NewServer()
	defer nats.Close()
	names := []string{"zero", "one", "two"}
	size := len(names)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			mine := []byte(names[c.Rank()])
			lens := make([]int64, c.Size())
			if err := a2a.AllGatherSlice(ctx, c, []int64{int64(len(mine))}, lens); err != nil {
				panic(err)
			}
			recvCounts := make([]int, c.Size())
			total := 0
			for i, n := range lens {
				recvCounts[i] = int(n)
				total += int(n)
			}
			all := make([]byte, total)
			if err := c.AllGatherV(ctx, mine, all, recvCounts); err != nil {
				panic(err)
			}
			if c.Rank() == 0 {
				fmt.Printf("lengths %v: %s\n", recvCounts, all)
			}
		})
	}
	wg.Wait()
	// Output:
	// lengths [4 3 3]: zeroonetwo
}

// Send and Recv pass messages between two ranks; a tag names the message.
// A token goes around a ring of three ranks, each adding its rank.
func ExampleComm_Send() {
	nats := a2atest.NewServer()
	defer nats.Close()
	const size, tag = 3, 7
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			ctx := context.Background()
			c, err := a2a.Join(ctx, a2a.Config{NATSURL: nats.URL, Group: "example", Rank: rank, WorldSize: size})
			if err != nil {
				panic(err)
			}
			defer c.Close()

			next, prev := (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()
			token := []byte(fmt.Sprint(c.Rank()))
			if c.Rank() != 0 {
				buf := make([]byte, 64)
				n, err := c.Recv(ctx, buf, prev, tag)
				if err != nil {
					panic(err)
				}
				token = append(buf[:n], token...)
			}
			if err := c.Send(ctx, token, next, tag); err != nil {
				panic(err)
			}
			if c.Rank() == 0 {
				buf := make([]byte, 64)
				n, err := c.Recv(ctx, buf, prev, tag)
				if err != nil {
					panic(err)
				}
				fmt.Printf("token back at rank 0: %s\n", buf[:n])
			}
		})
	}
	wg.Wait()
	// Output:
	// token back at rank 0: 012
}
