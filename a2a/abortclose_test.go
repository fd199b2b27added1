package a2a

import (
	"context"
	"errors"
	"flag"
	"strings"
	"sync"
	"testing"
	"time"
)

var abortCloseTrials = flag.Int("abort-close-trials", 100, "trials of TestAbortThenCloseTellsTheCause per transport")

// TestAbortThenCloseTellsTheCause: rank 0 passes a send buffer 1 byte short
// and closes at once. Its peers must learn why, not only that it left: every
// peer's call fails with ErrAborted wrapping rank 0's ErrInvalidArgument,
// in every trial, over shared memory and TCP. Before, the transport's
// goodbye overtook the abort on NATS in 2 of 4 runs ("peer lost (rank 0):
// shm: rank 0 closed its transport"). Groups run 10 at a time.
func TestAbortThenCloseTellsTheCause(t *testing.T) {
	url := startNATS(t)
	const n, batch = 3, 10
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			var mu sync.Mutex
			failed := 0
			for done := 0; done < *abortCloseTrials; done += batch {
				var wg sync.WaitGroup
				for range min(batch, *abortCloseTrials-done) {
					wg.Add(1)
					go func() {
						defer wg.Done()
						comms, err := joinGroup(url, n, func(c *Config) { c.Transport = tr })
						if err != nil {
							t.Error(err)
							return
						}
						defer func() {
							for _, c := range comms {
								c.Close()
							}
						}()
						if bad := abortThenClose(comms); bad != "" {
							mu.Lock()
							failed++
							if failed <= 3 {
								t.Error(bad)
							}
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
			}
			if failed > 0 {
				t.Errorf("%d of %d trials lost the cause", failed, *abortCloseTrials)
			}
		})
	}
}

// abortThenClose runs one trial and describes what went wrong ("" if
// nothing did).
func abortThenClose(comms []*Comm) string {
	errs := onAll(comms, func(c *Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		counts := []int{8, 8, 8}
		send, recv := make([]byte, 24), make([]byte, 24)
		if c.Rank() == 0 {
			err := c.AllToAllV(ctx, send[:23], counts, recv, counts)
			c.Close()
			return err
		}
		return c.AllToAllV(ctx, send, counts, recv, counts)
	})
	if !errors.Is(errs[0], ErrInvalidArgument) {
		return "rank 0: " + errString(errs[0])
	}
	for r := 1; r < len(errs); r++ {
		err := errs[r]
		if !errors.Is(err, ErrAborted) || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "aborted by rank 0") {
			return "rank " + string(rune('0'+r)) + ": " + errString(err) + ", want ErrAborted by rank 0 wrapping ErrInvalidArgument"
		}
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
