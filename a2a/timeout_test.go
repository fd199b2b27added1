package a2a

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTimeoutNamesTheMissingRanks: a timeout names the operation, its op
// sequence number and the ranks it was waiting for, and says what to check.
func TestTimeoutNamesTheMissingRanks(t *testing.T) {
	url := startNATS(t)
	t.Run("collective", func(t *testing.T) {
		// Ranks 2 and 3 never call: one LL round waits for both.
		comms := group(t, url, 4, func(c *Config) { c.Algo = "ll" })
		errs := onAll(comms[:2], func(c *Comm) error {
			d := 300 * time.Millisecond
			if c.Rank() == 1 {
				d = 20 * time.Second // rank 0's abort releases it
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			counts := []int{8, 8, 8, 8}
			return c.AllToAllV(ctx, make([]byte, 32), counts, make([]byte, 32), counts)
		})
		err := errs[0]
		var fe *Error
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &fe) {
			t.Fatalf("rank 0: %v, want ErrTimeout", err)
		}
		if fe.Rank != 2 || !slices.Equal(fe.Ranks, []int{2, 3}) {
			t.Errorf("rank 0: Rank %d, Ranks %v, want 2 and [2 3]", fe.Rank, fe.Ranks)
		}
		want := regexp.MustCompile(`^a2a: timeout \(ranks 2, 3\): AllToAllV \(op #\d+\) did not complete by its context's deadline, waiting for ranks 2, 3: ` +
			`check that every rank calls AllToAllV, in the same order; if some are only slow, give the call a longer deadline`)
		if !want.MatchString(err.Error()) {
			t.Errorf("rank 0: %q does not match %q", err, want)
		}
		if err := errs[1]; !errors.Is(err, ErrAborted) || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "aborted by rank 0") ||
			!strings.Contains(err.Error(), "waiting for ranks 2, 3") {
			t.Errorf("rank 1: %v, want rank 0's timeout", err)
		}
	})
	t.Run("Config.Timeout", func(t *testing.T) {
		comms := group(t, url, 2, func(c *Config) { c.Timeout = 300 * time.Millisecond })
		err := comms[0].AllReduce(context.Background(), make([]byte, 8), make([]byte, 8), Float32, Sum)
		var fe *Error
		if !errors.As(err, &fe) || !errors.Is(err, ErrTimeout) || fe.Rank != 1 || fe.Ranks != nil {
			t.Fatalf("got %v, want ErrTimeout naming rank 1", err)
		}
		want := regexp.MustCompile(`^a2a: timeout \(rank 1\): AllReduce \(op #\d+\) did not complete within 300ms \(Config.Timeout\), waiting for rank 1: check that every rank calls AllReduce`)
		if !want.MatchString(err.Error()) {
			t.Errorf("got %q, want it to match %q", err, want)
		}
	})
	t.Run("ExchangeCounts", func(t *testing.T) {
		comms := group(t, url, 2, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := comms[0].ExchangeCounts(ctx, []int{1, 1})
		want := regexp.MustCompile(`^a2a: timeout: ExchangeCounts \(op #\d+\) did not complete: the coordinator still lacks some rank's counts: ` +
			`check that every rank calls ExchangeCounts, in the same order; if some are only slow, give the call a longer deadline`)
		if !errors.Is(err, ErrTimeout) || !want.MatchString(err.Error()) {
			t.Errorf("got %v, want it to match %q", err, want)
		}
	})
	t.Run("Recv", func(t *testing.T) {
		comms := group(t, url, 2, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := comms[0].Recv(ctx, make([]byte, 8), 1, 7)
		var fe *Error
		if !errors.As(err, &fe) || !errors.Is(err, ErrTimeout) || fe.Rank != 1 {
			t.Fatalf("got %v, want ErrTimeout naming rank 1", err)
		}
		want := regexp.MustCompile(`^a2a: timeout \(rank 1\): Recv from rank 1 \(tag 7, op #\d+\) did not complete by its context's deadline: ` +
			`check that rank 1 calls Send to this rank with tag 7; if it is only slow, give the call a longer deadline`)
		if !want.MatchString(err.Error()) {
			t.Errorf("got %q, want it to match %q", err, want)
		}
	})
	t.Run("Wait", func(t *testing.T) {
		comms := group(t, url, 2, nil)
		r := comms[0].Irecv(context.Background(), make([]byte, 8), 1, 5)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := r.Wait(ctx)
		var fe *Error
		if !errors.As(err, &fe) || !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || fe.Rank != 1 {
			t.Fatalf("got %v, want ErrTimeout naming rank 1", err)
		}
		want := regexp.MustCompile(`^a2a: timeout \(rank 1\): Wait for Recv from rank 1 \(tag 5, op #\d+\): its context ended first, and the request is still in flight: ` +
			`Wait again, or check that rank 1 calls Send to this rank with tag 5`)
		if !want.MatchString(err.Error()) {
			t.Errorf("got %q, want it to match %q", err, want)
		}
		// Still in flight: it completes once rank 1 sends.
		errs := onAll(comms, func(c *Comm) error {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if c.Rank() == 0 {
				_, err := r.Wait(ctx)
				return err
			}
			return c.Send(ctx, make([]byte, 8), 0, 5)
		})
		mustAll(t, errs)
	})
}
