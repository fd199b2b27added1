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

// TestSlotsStored: Stored sees a peer's message for its epoch only, in the
// pair's own slot, without taking it; a Wait after a Stored that found
// nothing returns once the peer stores, also when a poll in between took
// the store's completion; after Close it reports false.
func TestSlotsStored(t *testing.T) {
	ts := newCluster(t, 3, 1) // 0-1 cross the veth pair, 0-2 loop back in rxe0
	const e = transport.FirstEpoch + 2
	if ts[1].Stored(0, e) {
		t.Fatal("Stored before any store")
	}
	// The same parity's older epoch, and the other parity, landed.
	old, other := transporttest.Pattern(1, 40), transporttest.Pattern(2, 40)
	if err := ts[0].Store(1, e-2, testTag, old); err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Store(1, e+1, testTag, other); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		epoch uint32
		want  []byte
	}{{e - 2, old}, {e + 1, other}} {
		dst := [][]byte{make([]byte, len(m.want)), nil, nil}
		if err := loadAll(ts[1], m.epoch, dst); err != nil || !bytes.Equal(dst[0], m.want) {
			t.Fatalf("load of epoch %d: %v, equal %v", m.epoch, err, bytes.Equal(dst[0], m.want))
		}
	}
	if ts[1].Stored(0, e) {
		t.Fatal("Stored reports a message of another epoch")
	}

	// The store arrives while Wait sleeps.
	ts[1].Wait(0) // take the events of the stores above
	if ts[1].Stored(0, e) {
		t.Fatal("Stored before the store")
	}
	msg := transporttest.Pattern(3, 300)
	stored := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		stored <- ts[0].Store(1, e, testTag, msg)
	}()
	start := time.Now()
	ts[1].Wait(waitBound)
	took := time.Since(start)
	if err := <-stored; err != nil {
		t.Fatal(err)
	}
	if took > waitBound/2 {
		t.Fatalf("Wait after a fruitless Stored returned after %v, though the peer stored after 50ms", took)
	}
	for end := time.Now().Add(5 * time.Second); !ts[1].Stored(0, e); {
		if time.Now().After(end) {
			t.Fatal("Stored misses the message")
		}
		ts[1].Wait(time.Millisecond)
	}
	if ts[1].Stored(2, e) || ts[2].Stored(0, e) || ts[0].Stored(1, e) {
		t.Fatal("Stored reports a message another pair's slot holds")
	}
	dst := [][]byte{make([]byte, len(msg)), nil, nil}
	if err := loadAll(ts[1], e, dst); err != nil || !bytes.Equal(dst[0], msg) {
		t.Fatalf("load after Stored: %v, equal %v", err, bytes.Equal(dst[0], msg))
	}

	// The store's completion arrives before Wait, and a poll for another
	// peer (Stored of rank 2) takes it after the look at rank 0: the event
	// Wait drains must still end its sleep.
	e2 := e + 2
	ts[1].Wait(0)
	if ts[1].Stored(0, e2) {
		t.Fatal("Stored before the store")
	}
	if err := ts[0].Store(1, e2, testTag, msg[:8]); err != nil {
		t.Fatal(err)
	}
	seen := func() uint64 {
		ts[1].mu.Lock()
		defer ts[1].mu.Unlock()
		return ts[1].seen
	}
	for before, end := seen(), time.Now().Add(5*time.Second); seen() == before; {
		if time.Now().After(end) {
			t.Fatal("the store's completion did not arrive")
		}
		if ts[1].Stored(2, e2) {
			t.Fatal("Stored reports rank 0's message as rank 2's")
		}
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	ts[1].Wait(waitBound)
	if took := time.Since(start); took > waitBound/2 {
		t.Fatalf("Wait slept %v after a poll took the completion of the store it should wake for", took)
	}
	if !ts[1].Stored(0, e2) {
		t.Fatal("Stored misses the message")
	}

	ts[1].Close()
	if ts[1].Stored(0, e2) {
		t.Error("Stored after Close")
	}
}
