package routing

import (
	"errors"
	"fmt"
)

// ErrInvalid is the sentinel every validation error of this package wraps; the
// wrapping error's message says which argument was wrong and why.
var ErrInvalid = errors.New("routing: invalid argument")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
