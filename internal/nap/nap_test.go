package nap

import (
	"testing"
	"time"
)

// TestForBlocksAtLeastD: For returns no earlier than d, for sleeps under
// and over the runtime poller's millisecond, and at once for d <= 0.
func TestForBlocksAtLeastD(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, time.Microsecond, 20 * time.Microsecond, 300 * time.Microsecond, 2 * time.Millisecond} {
		t0 := time.Now()
		For(d)
		if got := time.Since(t0); got < d {
			t.Errorf("For(%v) returned after %v", d, got)
		} else if d <= 0 && got > 100*time.Millisecond {
			t.Errorf("For(%v) blocked %v: want an immediate return", d, got)
		}
	}
}

// BenchmarkShortWait compares a 20 us wait in For with time.Sleep in an
// otherwise idle process: the wake-up time per wait is the benchmark's
// ns/op. time.Sleep's comes from the runtime poller, in whole milliseconds.
func BenchmarkShortWait(b *testing.B) {
	const d = 20 * time.Microsecond
	b.Run("nap", func(b *testing.B) {
		for range b.N {
			For(d)
		}
	})
	b.Run("time.Sleep", func(b *testing.B) {
		for range b.N {
			time.Sleep(d)
		}
	})
}
