package transporttest

import (
	"errors"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// WakeAndClose checks the end of tr's life as the engine relies on it: Wake
// ends a Wait parked in another goroutine, Close ends one too, Wake after
// Close does not panic, Wait after Close fails with ErrClosed, and a second
// Close succeeds. It closes tr.
func WakeAndClose(t testing.TB, tr transport.Transport) {
	t.Helper()
	woke := make(chan error, 1)
	go func() { woke <- tr.Wait(10 * time.Second) }()
	time.Sleep(10 * time.Millisecond)
	tr.Wake()
	select {
	case err := <-woke:
		if err != nil {
			t.Errorf("Wait woken by Wake: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Wake did not end a concurrent Wait")
	}
	go func() { woke <- tr.Wait(10 * time.Second) }()
	time.Sleep(10 * time.Millisecond)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if err != nil && !errors.Is(err, fault.ErrClosed) {
			t.Errorf("Wait ended by Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end a parked Wait")
	}
	tr.Wake() // no panic after Close
	if err := tr.Wait(0); !errors.Is(err, fault.ErrClosed) {
		t.Errorf("Wait after Close: %v, want ErrClosed", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
