package a2a

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// crash ends c as a killed process would end: its connections close with no
// leave message, and whatever it hosted (the coordinator, if elected here)
// is gone.
func crash(c *Comm) {
	c.life.closed.Store(true) // the test's cleanup must not leave on its behalf
	c.stopReports()
	c.tr.Close()
	c.nc.Close()
}

type shrinkRecorder struct {
	mu    sync.Mutex
	calls [][]int
}

func (s *shrinkRecorder) OpDone(OpEvent)                       {}
func (s *shrinkRecorder) CountsExchanged(time.Duration, error) {}
func (s *shrinkRecorder) Shrunk(lost []int, oldSize, newSize int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, append(slices.Clone(lost), oldSize, newSize))
}

// TestShrink kills one rank of four (the first, which likely hosts the
// elected coordinator, or another): the survivors' next operation fails with
// ErrPeerLost naming it, Shrink gives each a communicator of three, numbered
// in the old order, that runs verified collectives, and the observer hears of
// the shrink.
func TestShrink(t *testing.T) {
	url := startNATS(t)
	for _, victim := range []int{0, 2} {
		t.Run(fmt.Sprintf("rank%d", victim), func(t *testing.T) {
			rec := &shrinkRecorder{}
			comms := group(t, url, 4, func(c *Config) { c.Observer = rec })
			exchange(t, comms, matrixOf("uniform", 4, nil), false)
			crash(comms[victim])
			survivors := slices.Delete(slices.Clone(comms), victim, victim+1)
			lostAt := time.Now()
			errs := onAll(survivors, func(c *Comm) error {
				buf := []float64{1}
				for range 1000 {
					if err := AllReduceSlice(context.Background(), c, buf, buf, Sum); err != nil {
						return err
					}
				}
				return errors.New("no failure after 1000 AllReduces")
			})
			for i, err := range errs {
				if !errors.Is(err, ErrPeerLost) || !slices.Equal(lostRanks(err, 4), []int{victim}) {
					t.Fatalf("survivor %d: %v, want ErrPeerLost naming rank %d", survivors[i].Rank(), err, victim)
				}
			}
			t.Logf("loss seen by all survivors after %v", time.Since(lostAt).Round(time.Millisecond))
			shrunk := make([]*Comm, len(survivors))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			mustAll(t, onAll(survivors, func(c *Comm) error {
				i := slices.Index(survivors, c)
				nc, err := c.Shrink(ctx)
				if err == nil {
					shrunk[i] = nc
					t.Cleanup(func() { nc.Close() })
				}
				return err
			}))
			want := slices.Delete([]int{0, 1, 2, 3}, victim, victim+1)
			for i, nc := range shrunk {
				if nc.Rank() != i || nc.Size() != 3 || !slices.Equal(nc.FormerRanks(), want) {
					t.Errorf("survivor %d: rank %d of %d, former ranks %v; want %d of 3, %v", want[i], nc.Rank(), nc.Size(), nc.FormerRanks(), i, want)
				}
			}
			exchange(t, shrunk, matrixOf("uniform", 3, nil), false)
			mustAll(t, onAll(shrunk, func(c *Comm) error {
				buf := []float64{float64(c.FormerRanks()[c.Rank()])}
				if err := AllReduceSlice(ctx, c, buf, buf, Sum); err != nil {
					return err
				}
				if sum := float64(6 - victim); buf[0] != sum {
					return errors.New("wrong AllReduce sum after shrink")
				}
				return nil
			}))
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.calls) != 3 {
				t.Fatalf("observer heard %d shrinks, want one per survivor", len(rec.calls))
			}
			for _, c := range rec.calls {
				if !slices.Equal(c, []int{victim, 4, 3}) {
					t.Errorf("observer heard lost, old size, new size = %v, want [%d 4 3]", c, victim)
				}
			}
		})
	}
}

// TestShrinkRefused: a healthy communicator, or one aborted for another
// reason than a lost rank, has nothing to shrink.
func TestShrinkRefused(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	if _, err := comms[0].Shrink(context.Background()); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Shrink of a healthy communicator: %v, want ErrInvalidArgument", err)
	}
	comms[1].Abort(errors.New("application gave up"))
	for _, c := range comms {
		deadline := time.Now().Add(5 * time.Second)
		for c.Err() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := c.Shrink(context.Background()); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("rank %d: Shrink after an application abort: %v, want ErrInvalidArgument", c.Rank(), err)
		}
	}
}

// TestErrNamesDepartedPeer: once a rank closes its Comm, the others' Err
// says so (ErrPeerLost naming it) without any call of theirs failing first:
// what a library polling memory a peer writes (dispatch's decode mode) waits on.
func TestErrNamesDepartedPeer(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	if err := comms[1].Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for comms[0].Err() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var e *Error
	if err := comms[0].Err(); !errors.Is(err, ErrPeerLost) || !errors.As(err, &e) || e.Rank != 1 {
		t.Errorf("Err after rank 1 closed: %v, want ErrPeerLost naming rank 1", err)
	}
}
