package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
)

// The link-cut test (scripts/testbed.sh --link-cut) runs one such worker per
// rank across network namespaces and cuts a host's link while they loop:
//
//  1. join and loop ExchangeCounts (a control-plane wait), a verified
//     AllToAllV of changing counts and a verified AllReduce, printing
//     "linkcut: rank R running" after the first round;
//  2. when a call fails, print the moment (Unix microseconds, the script's
//     clock is the same machine's) and the error's kinds, and close;
//  3. join the same group again until it works (the script restores the link
//     meanwhile), run --rounds verified rounds and print "rejoined".
//
// The operations' deadline (--op-timeout, 60 s) is far beyond the 3 s the
// test allows, so the error must come from the library's own detection.

// errorKinds names the a2a error kinds err matches, outermost first
// ("aborted+peer-lost"), or "untyped".
func errorKinds(err error) string {
	kinds := []struct {
		name string
		err  error
	}{
		{"aborted", a2a.ErrAborted}, {"peer-lost", a2a.ErrPeerLost}, {"timeout", a2a.ErrTimeout},
		{"closed", a2a.ErrClosed}, {"mismatch", a2a.ErrMismatch}, {"invalid-argument", a2a.ErrInvalidArgument},
		{"auth", a2a.ErrAuth},
	}
	var names []string
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			names = append(names, k.name)
		}
	}
	if len(names) == 0 {
		return "untyped"
	}
	return strings.Join(names, "+")
}

// linkCutRound is one round of the loop: counts through the control plane,
// then a verified AllToAllV of them and a verified AllReduce.
func linkCutRound(ctx context.Context, s *rankState, o workerOptions, round int) (string, error) {
	seq := int64(round)
	rng := rand.New(rand.NewPCG(o.seed, uint64(seq)))
	for i := range s.matrix {
		s.matrix[i] = rng.IntN(64 << 10)
	}
	for j := range s.p {
		s.sendCounts[j] = s.matrix[s.me*s.p+j]
		s.recvCounts[j] = s.matrix[j*s.p+s.me]
	}
	octx, cancel := context.WithTimeout(ctx, o.opTimeout)
	defer cancel()
	got, err := s.c.ExchangeCounts(octx, s.sendCounts)
	if err != nil {
		return "exchangecounts", err
	}
	if fmt.Sprint(got) != fmt.Sprint(s.recvCounts) {
		return "exchangecounts", wrong("counts %v, want %v", got, s.recvCounts)
	}
	send := s.fillSend(seq)
	recv := s.recv[:sum(got)]
	if err := s.c.AllToAllV(octx, send, s.sendCounts, recv, got); err != nil {
		return "alltoallv", err
	}
	if err := s.checkRecv("alltoallv", seq, recv, got); err != nil {
		return "alltoallv", err
	}
	r := reduction{dt: reduce.Float32, op: reduce.Sum}
	n := 4 << 10
	values(s.send[:n], r.dt, s.seed, seq, s.me)
	if err := s.c.AllReduce(octx, s.send[:n], s.recv[:n], r.dt, r.op); err != nil {
		return "allreduce", err
	}
	if err := reduced(s.want[:n], s.scratch[:n], r, s.seed, seq, s.p); err != nil {
		return "allreduce", err
	}
	return "allreduce", check("allreduce", s.recv[:n], s.want[:n])
}

func runLinkCut(ctx context.Context, log *slog.Logger, o workerOptions, rounds int) error {
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		return err
	}
	cfg.Logger = log
	s := newRankState(cfg.WorldSize, o.seed)
	jctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	c, err := a2a.Join(jctx, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	s.c, s.me = c, c.Rank()
	var lastOK time.Time
	for round := 0; ; round++ {
		op, err := linkCutRound(ctx, s, o, round)
		if err == nil {
			lastOK = time.Now()
			if round == 0 {
				fmt.Printf("linkcut: rank %d running (epoch %d, %s)\n", s.me, c.Epoch(), c.TransportName())
			}
			continue
		}
		at := time.Now()
		if ve := (*verifyError)(nil); errors.As(err, &ve) {
			c.Abort(err)
			c.Close()
			return fmt.Errorf("round %d %s: %w", round, op, err)
		}
		if ctx.Err() != nil {
			c.Close()
			return ctx.Err()
		}
		fmt.Printf("linkcut: rank %d error at_us=%d kind=%s op=%s round=%d since_last_ok=%.3fs: %v\n",
			s.me, at.UnixMicro(), errorKinds(err), op, round, at.Sub(lastOK).Seconds(), err)
		break
	}
	t := time.Now()
	c.Close()
	fmt.Printf("linkcut: rank %d closed in %.3fs\n", s.me, time.Since(t).Seconds())

	// Join again until the link is back: a Join that cannot complete
	// (control plane or a peer unreachable) fails by its deadline.
	t = time.Now()
	deadline := t.Add(90 * time.Second)
	tries := 0
	for {
		tries++
		jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err = a2a.Join(jctx, cfg)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("join again: %d tries in %.1fs, last: %w", tries, time.Since(t).Seconds(), err)
		}
		log.Warn("join again failed, retrying", "err", err)
		time.Sleep(200 * time.Millisecond)
	}
	defer c.Close()
	s.c, s.me = c, c.Rank()
	for k := range rounds {
		// Numbered apart from the loop's rounds: the ranks failed in different ones.
		if op, err := linkCutRound(ctx, s, o, 1<<30+k); err != nil {
			return fmt.Errorf("after joining again, round %d %s: %w", k, op, err)
		}
	}
	fmt.Printf("linkcut: rank %d rejoined after %.2fs (%d tries, epoch %d, %s), %d rounds verified\n",
		s.me, time.Since(t).Seconds(), tries, c.Epoch(), c.TransportName(), rounds)
	return nil
}
