package transporttest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// SharedSizes are the message sizes SharedExchange cycles through: an empty
// and a tiny frame, and frames larger than a ring or a socket buffer, so
// that frames of the two communicators are read in part by the other one.
var SharedSizes = []int{0, 8, 4096, 300 << 10, 3 << 20}

// SharedExchange runs two communicators at once over the same connected
// transports (rank r's at trs[r]), each from its own goroutine per rank, as
// Comm.Split's children share their parent's data plane: the root
// (transport.Demux's comm 0) and a child (comm 1) whose rank i is the
// transport's rank n-1-i. In each of rounds rounds every rank sends every
// other rank a message of each communicator, of SharedSizes[round%5] bytes
// for the root and SharedSizes[(round+2)%5] for the child, on stream
// round%streams, and checks every byte it receives. It returns the first
// error.
func SharedExchange(trs []transport.Transport, rounds int, timeout time.Duration) error {
	n := len(trs)
	rev := make([]int, n)
	for i := range rev {
		rev[i] = n - 1 - i
	}
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	for r, tr := range trs {
		d := transport.NewDemux(tr, r, n)
		if d.Conn((r+1)%n, 0) != tr.Conn((r+1)%n, 0) {
			return fmt.Errorf("rank %d: Demux.Conn before sharing is not the transport's Conn", r)
		}
		v, err := d.Open(1, rev)
		if err != nil {
			return err
		}
		defer v.Close()
		wg.Go(func() { errs[2*r] = exchangeRounds(tr, d, r, n, 0, rounds, 0, timeout) })
		wg.Go(func() { errs[2*r+1] = exchangeRounds(v, v, n-1-r, n, 1, rounds, 2, timeout) })
	}
	wg.Wait()
	return FirstErr(errs)
}

// exchangeRounds is one communicator's side of SharedExchange on one rank:
// rank me of n, driving with tr's Wait and conns' Conns.
func exchangeRounds(tr transport.Transport, conns transport.Conns, me, n, comm, rounds, shift int, timeout time.Duration) error {
	streams := tr.Streams()
	for round := range rounds {
		size := SharedSizes[(round+shift)%len(SharedSizes)]
		stream := round % streams
		var jobs []Job
		dsts := make([][]byte, n)
		for p := range n {
			if p == me {
				continue
			}
			h := Hdr(me, stream, 0, uint64(round+1))
			jobs = append(jobs, SendJob(conns.Conn(p, stream), h, sharedPattern(comm, me, p, round, size)))
			dsts[p] = make([]byte, size)
			jobs = append(jobs, RecvJob(conns.Conn(p, stream), Hdr(p, stream, 0, uint64(round+1)), dsts[p]))
		}
		if err := Drive(tr, jobs, timeout); err != nil {
			return fmt.Errorf("comm %d rank %d round %d: %w", comm, me, round, err)
		}
		for p := range n {
			if p != me && string(dsts[p]) != string(sharedPattern(comm, p, me, round, size)) {
				return fmt.Errorf("comm %d rank %d round %d: wrong bytes from rank %d", comm, me, round, p)
			}
		}
	}
	return nil
}

func sharedPattern(comm, from, to, round, size int) []byte {
	return Pattern(uint64(comm<<48|from<<32|to<<16|round), size)
}

// SharedMismatch checks that a mismatch inside a child fails that child
// only: on two connected transports, rank 0's child sends a frame rank 1's
// child does not expect (another operation kind), while the roots exchange
// a message on the same stream. Rank 1's child must fail with ErrMismatch,
// and both roots must complete.
func SharedMismatch(trs []transport.Transport, timeout time.Duration) error {
	ds := []*transport.Demux{transport.NewDemux(trs[0], 0, 2), transport.NewDemux(trs[1], 1, 2)}
	var vs [2]*transport.View
	for r, d := range ds {
		v, err := d.Open(7, []int{0, 1})
		if err != nil {
			return err
		}
		defer v.Close()
		vs[r] = v
	}
	bad := Hdr(0, 0, 0, 1)
	bad.Kind = transport.OpBarrier
	if err := Drive(vs[0], []Job{SendJob(vs[0].Conn(1, 0), bad, []byte("child"))}, timeout); err != nil {
		return fmt.Errorf("child send: %w", err)
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	wg.Go(func() {
		err := Drive(vs[1], []Job{RecvJob(vs[1].Conn(0, 0), Hdr(0, 0, 0, 1), make([]byte, 5))}, timeout)
		if !errors.Is(err, fault.ErrMismatch) {
			errs[0] = fmt.Errorf("child receive: %v, want ErrMismatch", err)
		}
	})
	for r := range 2 {
		wg.Go(func() {
			got := make([]byte, 4)
			jobs := []Job{SendJob(ds[r].Conn(1-r, 0), Hdr(r, 0, 0, 1), []byte("root")),
				RecvJob(ds[r].Conn(1-r, 0), Hdr(1-r, 0, 0, 1), got)}
			if err := Drive(trs[r], jobs, timeout); err != nil {
				errs[1+r] = fmt.Errorf("root rank %d: %w", r, err)
			} else if string(got) != "root" {
				errs[1+r] = fmt.Errorf("root rank %d received %q", r, got)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
