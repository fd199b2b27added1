package routing

import "fmt"

// ErrInvalid is the sentinel every validation error of this package wraps; the
// wrapping error's message says which argument was wrong and why. It also
// matches a2a.ErrInvalidArgument under errors.Is, so a program testing a2a's
// kinds needs no case for routing.
var ErrInvalid error = &invalidError{"routing: invalid argument"}

// invalidError is ErrInvalid's type.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }

// Is matches a2a.ErrInvalidArgument without importing a2a (this package uses
// the standard library only): that kind says what it is by an
// InvalidArgument method.
func (e *invalidError) Is(target error) bool {
	k, ok := target.(interface{ InvalidArgument() bool })
	return ok && k.InvalidArgument()
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
