package verbs

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

const testTag = 5

// loadAll loads what every peer stored for epoch into dsts (by peer), parking
// in Wait while nothing arrives.
func loadAll(tr *Transport, epoch uint32, dsts [][]byte) error {
	states := make([]transport.SlotLoad, len(dsts))
	left := 0
	done := make([]bool, len(dsts))
	for q, d := range dsts {
		if d != nil {
			left++
		} else {
			done[q] = true
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for left > 0 {
		moved := false
		for q, d := range dsts {
			if done[q] {
				continue
			}
			ok, err := tr.Load(q, epoch, testTag, d, false, &states[q])
			if err != nil {
				return err
			}
			if ok {
				done[q], moved = true, true
				left--
			}
		}
		if !moved {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d loads not done", left)
			}
			tr.Wait(time.Millisecond)
		}
	}
	return nil
}

// Every rank stores to every peer and loads from each, for every size and
// both parities, over rxe and through one device's loopback: every byte
// arrives, and each epoch's words replace the last's.
func TestSlots(t *testing.T) {
	ts := newCluster(t, 3, 1)
	sizes := []int{0, 1, 3, 4, 5, 100, DefaultSlotBytes - 1, DefaultSlotBytes}
	epoch := transport.FirstEpoch
	for k, size := range sizes {
		msg := func(src, dst int) []byte { return transporttest.Pattern(uint64(1000*k+10*src+dst), size) }
		errs := make([]error, len(ts))
		got := make([][][]byte, len(ts))
		var wg sync.WaitGroup
		for r, tr := range ts {
			wg.Go(func() {
				got[r] = make([][]byte, len(ts))
				for q := range ts {
					if q == r {
						continue
					}
					got[r][q] = make([]byte, size)
					if err := tr.Store(q, epoch, testTag, msg(r, q)); err != nil {
						errs[r] = err
						return
					}
				}
				errs[r] = loadAll(tr, epoch, got[r])
			})
		}
		wg.Wait()
		if err := transporttest.FirstErr(errs); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		for r := range ts {
			for q := range ts {
				if q != r && !bytes.Equal(got[r][q], msg(q, r)) {
					t.Fatalf("%d bytes, epoch %d: rank %d got wrong data from rank %d", size, epoch, r, q)
				}
			}
		}
		epoch = transport.NextEpoch(epoch)
	}
	if n := ts[0].SlotBytes(1); n != DefaultSlotBytes {
		t.Errorf("SlotBytes %d", n)
	}
}

// Loads and stores that disagree fail as the Slots contract says.
func TestSlotsErrors(t *testing.T) {
	ts := newCluster(t, 2, 1)
	e := transport.FirstEpoch
	is := func(what string, err, kind error) {
		t.Helper()
		var fe *fault.Error
		if !errors.Is(err, kind) || !errors.As(err, &fe) || fe.Rank != 1 {
			t.Errorf("%s: %v, want %v naming rank 1", what, err, kind)
		}
	}
	is("store too big", ts[0].Store(1, e, testTag, make([]byte, DefaultSlotBytes+1)), fault.ErrInvalidArgument)
	is("store at epoch 1", ts[0].Store(1, 1, testTag, nil), fault.ErrInvalidArgument)
	is("store with a wide tag", ts[0].Store(1, e, 1<<transport.SlotTagBits, nil), fault.ErrInvalidArgument)
	var st transport.SlotLoad
	_, err := ts[0].Load(1, e, testTag, make([]byte, DefaultSlotBytes+1), false, &st)
	is("load too big", err, fault.ErrInvalidArgument)

	// Rank 1 stores with another tag, then 8 bytes where 4 are expected.
	wait := func(dst []byte, epoch uint32) error {
		var st transport.SlotLoad
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			done, err := ts[0].Load(1, epoch, testTag, dst, false, &st)
			if done || err != nil {
				return err
			}
			ts[0].Wait(time.Millisecond)
		}
		return errors.New("timeout")
	}
	if err := ts[1].Store(0, e, testTag+1, []byte("abcd")); err != nil {
		t.Fatal(err)
	}
	is("other tag", wait(make([]byte, 4), e), fault.ErrMismatch)
	e = transport.NextEpoch(e)
	if err := ts[1].Store(0, e, testTag, []byte("abcdefgh")); err != nil {
		t.Fatal(err)
	}
	is("other length", wait(make([]byte, 4), e), fault.ErrMismatch)

	// A frame on stream 0 while a load waits: the peer runs another
	// operation.
	e = transport.NextEpoch(e)
	if err := transporttest.Drive(ts[1], []transporttest.Job{
		transporttest.SendJob(ts[1].Conn(0, 0), transporttest.Hdr(1, 0, 0, 1), []byte("frame")),
	}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	is("frame while loading", wait(make([]byte, 4), e), fault.ErrMismatch)
}
