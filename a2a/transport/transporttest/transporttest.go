// Package transporttest drives transport.Conn operations the way the engine
// does, for the tests of every transport implementation (tcp, shm, and verbs
// later): one harness, so every transport is exercised alike.
package transporttest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// Epoch is the membership epoch the transport tests use.
const Epoch = 3

// Job is one op of a progress loop: exactly one of Send and Recv is set.
type Job struct {
	C    transport.Conn
	Send *transport.SendOp
	Recv *transport.RecvOp
	Done bool
}

// SendJob returns a job sending data with header h on c.
func SendJob(c transport.Conn, h transport.Header, data []byte) Job {
	op := new(transport.SendOp)
	op.Reset(h, data)
	return Job{C: c, Send: op}
}

// RecvJob returns a job receiving exactly len(dst) bytes matching want on c.
func RecvJob(c transport.Conn, want transport.Header, dst []byte) Job {
	op := new(transport.RecvOp)
	op.Reset(want, dst, false)
	return Job{C: c, Recv: op}
}

// Drive progresses jobs on tr like the engine does: it sweeps every pending op
// and parks in Wait(1ms) after a sweep in which nothing moved. Ops of one conn
// and direction must be listed in wire order.
func Drive(tr transport.Transport, jobs []Job, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	left := 0
	for i := range jobs {
		if !jobs[i].Done {
			left++
		}
	}
	for left > 0 {
		moved := false
		for i := range jobs {
			j := &jobs[i]
			if j.Done {
				continue
			}
			var done bool
			var err error
			if j.Send != nil {
				before := j.Send.Progress
				done, err = j.C.TrySend(j.Send)
				moved = moved || j.Send.Progress != before
			} else {
				before := j.Recv.Progress
				done, err = j.C.TryRecv(j.Recv)
				moved = moved || j.Recv.Progress != before
			}
			if err != nil {
				return err
			}
			if done {
				j.Done = true
				left--
				moved = true
			}
		}
		if moved {
			continue
		}
		if time.Now().After(deadline) {
			return fault.New(fault.ErrTimeout, -1, "test: %d ops not done after %v", left, timeout)
		}
		if err := tr.Wait(time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// DriveAll runs Drive on every transport concurrently and returns each
// rank's error.
func DriveAll[T transport.Transport](ts []T, jobs [][]Job, timeout time.Duration) []error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for r := range ts {
		wg.Go(func() { errs[r] = Drive(ts[r], jobs[r], timeout) })
	}
	wg.Wait()
	return errs
}

// Pattern returns n deterministic pseudo-random bytes for seed.
func Pattern(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8 && i+k < n; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// Hdr is the frame header rank src uses for frame round on stream.
func Hdr(src, stream, round int, seq uint64) transport.Header {
	return transport.Header{
		Kind:   transport.OpAllToAllV,
		Algo:   1,
		Flags:  transport.FlagLast,
		Stream: uint16(stream),
		Epoch:  Epoch,
		Src:    uint32(src),
		Round:  uint32(round),
		Seq:    seq,
	}
}

// FirstErr returns the first non-nil error, naming its rank.
func FirstErr(errs []error) error {
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}
