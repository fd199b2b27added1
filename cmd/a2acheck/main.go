// Command a2acheck is one rank of a verified AllToAllV job, to try how a
// launcher starts ranks: it joins the group a2a.ConfigFromEnv describes
// (A2A_* or the variables of mpirun, mpiexec, srun or torchrun), runs
// AllToAllV rounds of uneven blocks whose receive counts it learns with
// ExchangeCounts, checks every byte it receives, and exits 1 on a wrong count
// or byte or any error.
//
//	mpirun -n 4 -x A2A_NATS_URL -x A2A_CREDS a2acheck [--rounds N] [--big BYTES]
//
// docs/LAUNCHERS.md says where those variables come from (A2A_CREDS: the
// path of a2ad serve's credentials file) and how each launcher passes them on; its tests run the
// page's commands with this program as the ranks.
//
// Each rank prints one line on success:
//
//	a2acheck: rank 2 of 4 launcher=openmpi local=2/4 group=openmpi-562561025 bytes=1234 ok
//
// --corrupt R makes rank R send one wrong byte, to see the check fail.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/a2a-moe/a2a/a2a"
)

func main() {
	rounds := flag.Int("rounds", 3, "AllToAllV rounds")
	big := flag.Int("big", 256<<10, "extra bytes rank 0 sends to rank 1 in round 1 (several frames)")
	corrupt := flag.Int("corrupt", -1, "rank that sends one wrong byte (-1: none)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline of the whole job")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	line, err := run(ctx, log, *rounds, *big, *corrupt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "a2acheck:", err)
		os.Exit(1)
	}
	fmt.Println("a2acheck:", line)
}

// run joins, runs the rounds and returns the success line.
func run(ctx context.Context, log *slog.Logger, rounds, big, corrupt int) (string, error) {
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		return "", err
	}
	cfg.Logger = log
	c, err := a2a.Join(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// A failed check aborts the communicator, so the other ranks stop at
	// once (with ErrAborted) instead of waiting for this one until their
	// timeout.
	me, p := c.Rank(), c.Size()
	if cfg.Rank >= 0 && me != cfg.Rank {
		return "", fmt.Errorf("joined as rank %d, configured as %d", me, cfg.Rank)
	}
	sendCounts, wantRecv := make([]int, p), make([]int, p)
	total := 0
	for round := range rounds {
		for peer := range p {
			sendCounts[peer] = blockLen(me, peer, round, big)
			wantRecv[peer] = blockLen(peer, me, round, big)
		}
		recvCounts, err := c.ExchangeCounts(ctx, sendCounts)
		if err != nil {
			return "", err
		}
		for peer, n := range recvCounts {
			if n != wantRecv[peer] {
				return "", c.Abort(fmt.Errorf("round %d: ExchangeCounts says rank %d sends %d bytes, want %d", round, peer, n, wantRecv[peer]))
			}
		}
		send := make([]byte, sum(sendCounts))
		off := 0
		for peer, n := range sendCounts {
			fill(send[off:off+n], me, peer, round)
			off += n
		}
		if me == corrupt && len(send) > 0 {
			send[len(send)/2] ^= 0x5a
		}
		recv := make([]byte, sum(recvCounts))
		if err := c.AllToAllV(ctx, send, sendCounts, recv, recvCounts); err != nil {
			return "", err
		}
		off = 0
		for peer, n := range recvCounts {
			want := make([]byte, n)
			fill(want, peer, me, round)
			for i := range n {
				if recv[off+i] != want[i] {
					return "", c.Abort(fmt.Errorf("round %d: byte %d of %d from rank %d is %#02x, want %#02x", round, i, n, peer, recv[off+i], want[i]))
				}
			}
			off += n
		}
		total += len(recv)
	}
	return fmt.Sprintf("rank %d of %d launcher=%s local=%d/%d group=%s bytes=%d ok",
		me, p, cfg.Launcher, cfg.LocalRank, cfg.LocalSize, cfg.Group, total), nil
}

// blockLen is how many bytes rank src sends rank dst in a round: uneven
// (1..1000 B), and once a large one that travels as several frames.
func blockLen(src, dst, round, big int) int {
	n := (src*131+dst*71+round*29)%1000 + 1
	if round == 1 && src == 0 && dst == 1 {
		n += big
	}
	return n
}

// fill writes the bytes src sends dst in a round: every byte depends on all
// four, so a block landing at the wrong place or round shows.
func fill(b []byte, src, dst, round int) {
	for i := range b {
		b[i] = byte(i*131 + i>>8 + src*17 + dst*29 + round*43)
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
