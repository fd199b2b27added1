package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/routing"
)

// TestNewRejectsBadConfig covers the configurations New refuses before
// exchanging anything (so a single rank can call it).
func TestNewRejectsBadConfig(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	pl3, err := routing.Contiguous(4, 3)
	if err != nil {
		t.Fatal(err)
	}
	pl5, err := routing.Contiguous(5, 2)
	if err != nil {
		t.Fatal(err)
	}
	ok := Config{Experts: 4, K: 2, Hidden: 8}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no experts", func(c *Config) { c.Experts = 0 }, "experts 0"},
		{"k > experts", func(c *Config) { c.K = 5 }, "top-k 5"},
		{"k = 0", func(c *Config) { c.K = 0 }, "top-k 0"},
		{"hidden 0", func(c *Config) { c.Hidden = 0 }, "hidden size 0"},
		{"integer dtype", func(c *Config) { c.DType = reduce.Int32 }, "dtype int32"},
		{"counts mode", func(c *Config) { c.Counts = 9 }, "counts mode"},
		{"NaN capacity", func(c *Config) { c.CapacityFactor = float64(nan()) }, "capacity factor"},
		{"placement over other ranks", func(c *Config) { c.Placement = pl3 }, "over 3 ranks"},
		{"placement of other experts", func(c *Config) { c.Placement = pl5 }, "placement of 5 experts"},
		{"broken placement", func(c *Config) { c.Placement = &routing.Placement{Experts: 4, Ranks: 2} }, "placement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.mod(&cfg)
			d, err := New(context.Background(), comms[0], cfg)
			if d != nil || !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, %v; want ErrInvalidArgument mentioning %q", d, err, tc.want)
			}
		})
	}
	if _, err := New(context.Background(), nil, ok); !errors.Is(err, a2a.ErrInvalidArgument) {
		t.Errorf("New(nil Comm): %v", err)
	}
}

// TestNewMismatch: ranks configuring different layers fail New with
// ErrMismatch on every rank, and the Comm stays usable.
func TestNewMismatch(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 3, nil)
	errs := onAll(3, func(r int) error {
		cfg := Config{Experts: 6, K: 2, Hidden: 8, Logger: discard}
		if r == 2 {
			cfg.Hidden = 16
		}
		d, err := New(context.Background(), comms[r], cfg)
		if err == nil {
			d.Close()
		}
		return err
	})
	for r, err := range errs {
		var ae *a2a.Error
		if !errors.Is(err, a2a.ErrMismatch) || !errors.As(err, &ae) {
			t.Errorf("rank %d: %v, want an *a2a.Error matching ErrMismatch", r, err)
			continue
		}
		other, want := 2, fmt.Sprintf("a2a: collective mismatch (rank 2): dispatch: rank 2 configured another MoE layer: "+
			"Config.Hidden is 16 there, 8 on this rank (rank %d); every rank must pass New the same Config", r)
		if r == 2 {
			other, want = 0, "a2a: collective mismatch (rank 0): dispatch: rank 0 configured another MoE layer: "+
				"Config.Hidden is 8 there, 16 on this rank (rank 2); every rank must pass New the same Config"
		}
		if ae.Rank != other || err.Error() != want {
			t.Errorf("rank %d: %q (Rank %d), want %q", r, err, ae.Rank, want)
		}
	}
	newDispatchers(t, comms, Config{Experts: 6, K: 2, Hidden: 8, Logger: discard})

	// Every field is named, with both values.
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.K = 3 }, "Config.K is 3 there, 2 on this rank"},
		{func(c *Config) { c.DType = reduce.BFloat16 }, "Config.DType is bfloat16 there, float32 on this rank"},
		{func(c *Config) { c.CapacityFactor = 1.25 }, "Config.CapacityFactor is 1.25 there, 0 on this rank"},
		{func(c *Config) { c.Counts = CountsNATS }, "Config.Counts is nats there"},
		{func(c *Config) { c.Placement, _ = routing.FromTable(6, 3, []int{2, 2, 1, 1, 0, 0}) }, "Config.Placement is slot table"},
		{func(c *Config) { c.Rebalance = Rebalance{Every: 3, Mover: &paramStore{}} }, "Config.Rebalance.Every is 3 there, 0 on this rank"},
	} {
		errs := onAll(3, func(r int) error {
			cfg := Config{Experts: 6, K: 2, Hidden: 8, Logger: discard}
			if r == 2 {
				tc.mod(&cfg)
			}
			d, err := New(context.Background(), comms[r], cfg)
			if err == nil {
				d.Close()
			}
			return err
		})
		if err := errs[0]; !errors.Is(err, a2a.ErrMismatch) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rank 0: %v, want it to say %q", err, tc.want)
		}
	}
}

// TestValidation: bad arguments fail with ErrInvalidArgument and a message
// naming the problem, before the Comm is touched, so a correct step works
// afterwards.
func TestValidation(t *testing.T) {
	const ranks, experts, k, hidden = 2, 4, 2, 4
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	l := layer{experts: experts, k: k, hidden: hidden, tokens: 6, dtype: reduce.BFloat16, seed: 3}
	ds := newDispatchers(t, comms, Config{Experts: experts, K: k, Hidden: hidden, DType: reduce.BFloat16, Logger: discard})
	ctx := context.Background()
	d := ds[0]
	rb := d.RowBytes()
	good := func() ([]byte, *routing.Decision) { return l.tokenRows(0, 0), l.decision(0, 0) }

	for _, tc := range []struct {
		name string
		mod  func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision)
		want string
	}{
		{"ragged token buffer", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) { return tok[:len(tok)-1], dec },
			"not a multiple of the row size 8 (hidden 4 x 2-byte bfloat16)"},
		{"fewer token rows than routed", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) { return tok[:len(tok)-rb], dec },
			"decision routes"},
		{"nil decision", func(tok []byte, _ *routing.Decision) ([]byte, *routing.Decision) { return tok, nil }, "nil routing decision"},
		{"k differs", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.K = 1
			return tok, dec
		}, "k=1 slots per token, the layer's top-k is 2"},
		{"weights shape", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Weight = dec.Weight[:len(dec.Weight)-1]
			return tok, dec
		}, "weights, want 12 each"},
		{"expert ids shape", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Expert = append(dec.Expert, 0)
			return tok, dec
		}, "13 expert ids"},
		{"expert out of range", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Expert[3] = experts
			return tok, dec
		}, "token 1 slot 1: expert id 4 out of range [0, 4)"},
		{"negative expert", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Expert[0] = -2
			return tok, dec
		}, "expert id -2 out of range"},
		{"expert twice", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Expert[5] = dec.Expert[4]
			return tok, dec
		}, "token 2: expert"},
		{"NaN weight", func(tok []byte, dec *routing.Decision) ([]byte, *routing.Decision) {
			dec.Weight[2] = nan()
			return tok, dec
		}, "gate weight NaN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, dec := tc.mod(good())
			for name, f := range map[string]func(context.Context, []byte, *routing.Decision) (*Handle, error){
				"Dispatch": d.Dispatch, "DispatchAsync": d.DispatchAsync,
			} {
				h, err := f(ctx, tok, dec)
				if h != nil || !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s = %v, %v; want ErrInvalidArgument mentioning %q", name, h, err, tc.want)
				}
			}
		})
	}

	// Combine's checks, on a real dispatched handle of every rank.
	mustAll(t, onAll(ranks, func(r int) error {
		d := ds[r]
		tok := l.tokenRows(r, 1)
		h, err := d.Dispatch(ctx, tok, l.decision(r, 1))
		if err != nil {
			return err
		}
		other := &Handle{d: ds[1-r], state: stateDispatched}
		for _, tc := range []struct {
			name      string
			h         *Handle
			exp, out  []byte
			wantInMsg string
		}{
			{"nil handle", nil, h.Output(), tok, "nil handle"},
			{"foreign handle", other, h.Output(), tok, "another dispatcher"},
			{"short outputs", h, h.Output()[:len(h.Recv())-1], tok, "expert outputs hold"},
			{"long combine output", h, h.Output(), append(tok[:len(tok):len(tok)], 0, 0), "combine output holds"},
		} {
			if err := d.Combine(ctx, tc.h, tc.exp, tc.out); !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantInMsg) {
				return fmt.Errorf("%s: %v, want ErrInvalidArgument mentioning %q", tc.name, err, tc.wantInMsg)
			}
		}
		runExperts(h, l.dtype, l.hidden, h.Output())
		if err := d.Combine(ctx, h, h.Output(), tok); err != nil {
			return err
		}
		if err := checkCombined(l, r, 1, tok); err != nil {
			return err
		}
		if err := d.Combine(ctx, h, h.Output(), tok); !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), "already combined") {
			return fmt.Errorf("second combine: %v", err)
		}
		h.Release()
		h.Release() // no-op
		if err := d.Combine(ctx, h, nil, nil); !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), "released") {
			return fmt.Errorf("combine after release: %v", err)
		}
		return nil
	}))

	// Nothing above touched the Comm: a whole step still works everywhere.
	c := dispatchCase{ranks: ranks, l: l}
	pl := d.Placement()
	mustAll(t, onAll(ranks, func(r int) error { return runStep(ds[r], c, pl, r, 2) }))
}

// TestClosed: a closed dispatcher refuses work with ErrClosed; Close is
// idempotent and leaves the Comm open.
func TestClosed(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 1, nil)
	l := layer{experts: 2, k: 1, hidden: 4, tokens: 3, dtype: reduce.Float32, seed: 1}
	d, err := New(context.Background(), comms[0], Config{Experts: 2, K: 1, Hidden: 4, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.Dispatch(context.Background(), l.tokenRows(0, 0), l.decision(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Dispatch(context.Background(), l.tokenRows(0, 0), l.decision(0, 0)); !errors.Is(err, a2a.ErrClosed) {
		t.Errorf("Dispatch after Close: %v", err)
	}
	tok := make([]byte, len(l.tokenRows(0, 0)))
	if err := d.CombineAsync(context.Background(), h, h.Output(), tok); !errors.Is(err, a2a.ErrClosed) {
		t.Errorf("CombineAsync after Close: %v", err)
	}
	if err := comms[0].AllToAll(context.Background(), make([]byte, 4), make([]byte, 4)); err != nil {
		t.Errorf("Comm after dispatcher Close: %v", err)
	}
}

// TestExchangeError: a failing exchange (here a deadline, as when a peer
// never shows up) surfaces through Wait of the asynchronous form, and the
// handle can then only be released.
func TestExchangeError(t *testing.T) {
	url := startNATS(t)
	comms := group(t, url, 2, nil)
	ds := newDispatchers(t, comms, Config{Experts: 2, K: 1, Hidden: 4, Logger: discard})
	l := layer{experts: 2, k: 1, hidden: 4, tokens: 3, dtype: reduce.Float32, seed: 1}
	// Rank 1 never dispatches.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	tok := l.tokenRows(0, 0)
	h, err := ds[0].DispatchAsync(ctx, tok, l.decision(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); !errors.Is(err, a2a.ErrTimeout) {
		t.Fatalf("Wait: %v, want ErrTimeout", err)
	}
	if err := ds[0].Combine(context.Background(), h, h.Output(), tok); !errors.Is(err, a2a.ErrInvalidArgument) || !strings.Contains(err.Error(), "did not succeed") {
		t.Errorf("Combine after a failed dispatch: %v", err)
	}
	h.Release()
}

func nan() float32 {
	z := float32(0)
	return z / z
}

// TestParseRowPath checks that ParseRowPath reads back what RowPath.String
// writes, and refuses anything else with ErrInvalidArgument.
func TestParseRowPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want RowPath
		ok   bool
	}{
		{"auto", RowsAuto, true},
		{"alltoallv", RowsAllToAllV, true},
		{" AllToAllV ", RowsAllToAllV, true},
		{RowsAllToAllV.String(), RowsAllToAllV, true},
		{"", 0, false},
		{"shm", 0, false},
	} {
		got, err := ParseRowPath(tc.in)
		switch {
		case !tc.ok && !errors.Is(err, a2a.ErrInvalidArgument):
			t.Errorf("ParseRowPath(%q) = %v, %v, want ErrInvalidArgument", tc.in, got, err)
		case tc.ok && (err != nil || got != tc.want):
			t.Errorf("ParseRowPath(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestReleasedHandle: once released, a Handle's accessors return nil or 0
// instead of the step's data, which a later step reuses.
func TestReleasedHandle(t *testing.T) {
	const ranks = 2
	url := startNATS(t)
	comms := group(t, url, ranks, nil)
	l := layer{experts: 4, k: 2, hidden: 4, tokens: 6, dtype: reduce.Float32, seed: 9}
	ds := newDispatchers(t, comms, Config{Experts: 4, K: 2, Hidden: 4, Logger: discard})
	hs := make([]*Handle, ranks)
	mustAll(t, onAll(ranks, func(r int) error {
		h, err := ds[r].Dispatch(context.Background(), l.tokenRows(r, 0), l.decision(r, 0))
		hs[r] = h
		return err
	}))
	h := hs[0]
	if h.Recv() == nil || h.Segments(0) == nil || h.Decision() == nil || h.ExpertLoad() == nil || h.Tokens() == 0 || h.Output() == nil {
		t.Fatal("a dispatched handle lacks its data")
	}
	for _, h := range hs {
		h.Release()
	}
	if got := h.Recv(); got != nil {
		t.Errorf("Recv after Release: %d bytes, want nil", len(got))
	}
	if got := h.Output(); got != nil {
		t.Errorf("Output after Release: %d bytes, want nil", len(got))
	}
	if got := h.Segments(0); got != nil {
		t.Errorf("Segments after Release: %v, want nil", got)
	}
	if got := h.Decision(); got != nil {
		t.Errorf("Decision after Release: %v, want nil", got)
	}
	if got := h.ExpertLoad(); got != nil {
		t.Errorf("ExpertLoad after Release: %v, want nil", got)
	}
	if h.Tokens() != 0 || h.Rows() != 0 || h.ExpertRows(0) != 0 || h.Stats() != (Stats{}) {
		t.Errorf("counts after Release: tokens %d, rows %d, expert rows %d, stats %+v, want 0", h.Tokens(), h.Rows(), h.ExpertRows(0), h.Stats())
	}
	h.Release() // a no-op
}
