package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/internal/launch"
)

func cmdDemo(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	n := fs.Int("n", 4, "local ranks")
	steps := fs.Int("steps", 4, "exchange steps")
	maxBytes := fs.Int("max", 64<<10, "largest block a rank sends one peer")
	worker := fs.Bool("worker", false, "internal: run as one rank")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if *worker {
		return demoWorker(ctx, log, *steps, *maxBytes)
	}
	fmt.Printf("a2a demo: %d local ranks, embedded NATS control plane, data plane per A2A_TRANSPORT (default: shared memory on one host), %d steps of variable-size AllToAllV\n", *n, *steps)
	return launchSelf(ctx, log, "demo", args, launch.Spec{N: *n})
}

// demoWorker is one rank: every step it draws new send counts (as an MoE
// router would), learns its receive counts (over NATS, or in-band on even
// steps), exchanges, verifies every byte, and rank 0 prints the traffic matrix.
func demoWorker(ctx context.Context, log *slog.Logger, steps, maxBytes int) error {
	c, err := joinWorker(ctx, log, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	rank, n := c.Rank(), c.Size()
	sendCounts, recvCounts := make([]int, n), make([]int, n)
	matrix := make([]int, n*n)
	okSend, okRecv := make([]byte, n), make([]byte, n)
	for step := range steps {
		rng := rand.New(rand.NewPCG(uint64(step), uint64(rank)))
		total := 0
		for j := range sendCounts {
			sendCounts[j] = rng.IntN(maxBytes + 1)
			if rng.IntN(5) == 0 {
				sendCounts[j] = 0 // some experts get no tokens this step
			}
			total += sendCounts[j]
		}
		send := make([]byte, total)
		fillSend(send, rank, sendCounts)
		how := "counts over NATS"
		start := time.Now()
		if err := c.ExchangeCountsMatrix(ctx, sendCounts, recvCounts, matrix); err != nil {
			return err
		}
		countsTime := time.Since(start)
		recvTotal := 0
		for _, v := range recvCounts {
			recvTotal += v
		}
		recv := make([]byte, recvTotal)
		start = time.Now()
		if step%2 == 1 {
			how = "counts in-band"
			learned := make([]int, n)
			if err := c.AllToAllVInBand(ctx, send, sendCounts, recv, learned); err != nil {
				return err
			}
			for i := range learned {
				if learned[i] != recvCounts[i] {
					return fmt.Errorf("step %d: in-band counts %v differ from the NATS exchange %v", step, learned, recvCounts)
				}
			}
		} else if err := c.AllToAllV(ctx, send, sendCounts, recv, recvCounts); err != nil {
			return err
		}
		moveTime := time.Since(start)
		bad := verifyRecv(recv, rank, recvCounts)
		for j := range okSend {
			okSend[j] = 1
			if bad >= 0 {
				okSend[j] = 0
			}
		}
		if err := c.AllToAll(ctx, okSend, okRecv); err != nil {
			return err
		}
		allOK := true
		for _, v := range okRecv {
			allOK = allOK && v == 1
		}
		if rank == 0 {
			printStep(step, how, algoName(c), matrix, n, countsTime, moveTime, allOK)
		}
		if !allOK {
			return fmt.Errorf("step %d: verification failed (rank %d first bad byte at %d)", step, rank, bad)
		}
	}
	if rank == 0 {
		fmt.Printf("all %d steps verified on %d ranks\n", steps, n)
	}
	return nil
}

func algoName(c *a2a.Comm) string { return c.LastAlgo() }

func printStep(step int, how, algo string, m []int, n int, counts, move time.Duration, ok bool) {
	var sb strings.Builder
	total := 0
	fmt.Fprintf(&sb, "step %d (%s, %s): bytes sent, row = source rank, column = destination\n", step, how, algo)
	sb.WriteString("        ")
	for j := range n {
		fmt.Fprintf(&sb, "%9s", fmt.Sprintf("->%d", j))
	}
	sb.WriteString("\n")
	for i := range n {
		fmt.Fprintf(&sb, "  rank %d", i)
		for j := range n {
			fmt.Fprintf(&sb, "%9d", m[i*n+j])
			total += m[i*n+j]
		}
		sb.WriteString("\n")
	}
	status := "verified"
	if !ok {
		status = "FAILED"
	}
	fmt.Fprintf(&sb, "  %d bytes moved; counts %v, exchange %v; %s\n", total, counts.Round(time.Microsecond), move.Round(time.Microsecond), status)
	fmt.Print(sb.String())
}
