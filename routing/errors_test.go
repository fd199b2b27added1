package routing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/routing"
)

// TestErrorsMatchA2A: routing's errors match a2a.ErrInvalidArgument as well
// as routing.ErrInvalid, and no other kind, and say what was wrong.
func TestErrorsMatchA2A(t *testing.T) {
	var d routing.Decision
	var p routing.Plan
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"Route", func() error { return routing.Gate{Experts: 4, K: 5}.Route(make([]float32, 4), 1, &d) }, "gate k 5, want 1 <= k <= experts (4)"},
		{"Contiguous", func() error { _, err := routing.Contiguous(0, 2); return err }, "experts 0, want >= 1"},
		{"FromTable", func() error { _, err := routing.FromTable(2, 2, []int{0, 3}); return err }, "expert 1 on rank 3, want rank in [0, 2)"},
		{"Apply", func() error { _, err := routing.Capacity{Factor: 1}.Apply(&d, 0, nil); return err }, "experts 0, want >= 1"},
		{"Build", func() error { return p.Build(nil, nil) }, "nil"},
	} {
		err := tc.call()
		if !errors.Is(err, a2a.ErrInvalidArgument) || !errors.Is(err, routing.ErrInvalid) {
			t.Errorf("%s: %v, want a2a.ErrInvalidArgument and routing.ErrInvalid", tc.name, err)
			continue
		}
		for _, other := range []error{a2a.ErrMismatch, a2a.ErrPeerLost, a2a.ErrAborted, a2a.ErrTimeout, a2a.ErrClosed, a2a.ErrAuth} {
			if errors.Is(err, other) {
				t.Errorf("%s: %v matches %v too", tc.name, err, other)
			}
		}
		if !strings.HasPrefix(err.Error(), "routing: invalid argument: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.name, err, tc.want)
		}
	}
}
