// Package fault holds the error kinds shared by every layer of a2a, so that the
// control plane, the transports and the engine return errors that callers match
// with errors.Is against the sentinels package a2a re-exports.
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
)

// The error kinds. Every error a2a returns for one of these situations matches
// exactly one kind with errors.Is (an abort caused by a lost peer matches both
// ErrAborted and ErrPeerLost).
var (
	ErrInvalidArgument = error(invalidArgument{})
	ErrMismatch        = errors.New("a2a: collective mismatch")
	ErrPeerLost        = errors.New("a2a: peer lost")
	ErrAborted         = errors.New("a2a: communicator aborted")
	ErrTimeout         = errors.New("a2a: timeout")
	ErrClosed          = errors.New("a2a: communicator closed")
	ErrAuth            = errors.New("a2a: not authorized")
	ErrResource        = errors.New("a2a: out of resources")
)

// invalidArgument is ErrInvalidArgument's type. Its InvalidArgument method
// is how errors of packages that may import nothing of a2a (package
// routing: the standard library only) match ErrInvalidArgument: their Is
// method looks for it, so the layering stays one way.
type invalidArgument struct{}

func (invalidArgument) Error() string { return "a2a: invalid argument" }

// InvalidArgument marks the kind of a call's wrong arguments.
func (invalidArgument) InvalidArgument() bool { return true }

// Error is a typed failure. Kind is one of the sentinels above; Rank is the rank
// the failure concerns (the lost peer, the rank that aborted), or -1. When it
// concerns several ranks (the ranks a timed-out operation was waiting for),
// Ranks lists them all, in order, and Rank is the first of them.
type Error struct {
	Kind   error
	Rank   int
	Ranks  []int // set only when the failure concerns several ranks
	Detail string
	Err    error // underlying cause, may be nil
}

// New returns an *Error of the given kind with a formatted detail.
func New(kind error, rank int, format string, args ...any) *Error {
	return &Error{Kind: kind, Rank: rank, Detail: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error of the given kind wrapping cause.
func Wrap(kind error, rank int, cause error, format string, args ...any) *Error {
	return &Error{Kind: kind, Rank: rank, Detail: fmt.Sprintf(format, args...), Err: cause}
}

func (e *Error) Error() string {
	s := e.Kind.Error()
	switch {
	case len(e.Ranks) > 1:
		s += " (" + RanksText(e.Ranks) + ")"
	case e.Rank >= 0:
		s += fmt.Sprintf(" (rank %d)", e.Rank)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// RanksText names ranks for a message: "rank 2", "ranks 2, 5", "no rank".
func RanksText(ranks []int) string {
	switch len(ranks) {
	case 0:
		return "no rank"
	case 1:
		return "rank " + strconv.Itoa(ranks[0])
	}
	b := []byte("ranks ")
	for i, r := range ranks {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(r), 10)
	}
	return string(b)
}

// Is reports whether target is this error's kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the cause, so an abort caused by a lost peer also matches ErrPeerLost.
func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the sentinel err matches, or nil. An abort matches the kind
// of its cause first (ErrAborted wrapping ErrResource is ErrResource), so a
// cause keeps its kind when it travels to the peers.
func KindOf(err error) error {
	for _, k := range []error{ErrInvalidArgument, ErrMismatch, ErrPeerLost, ErrTimeout, ErrClosed, ErrAuth, ErrResource, ErrAborted} {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

// LogLevel is the level at which to log an abort caused by err: Info when
// the caller cancelled its own context (Ctrl-C of a job, a shutdown), which
// is a decision rather than a fault, and Warn for everything else.
func LogLevel(err error) slog.Level {
	if errors.Is(err, context.Canceled) {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// FromContext maps a context error to an a2a error that still matches it:
// ErrTimeout for a deadline, ErrAborted for a cancellation.
func FromContext(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return Wrap(ErrTimeout, -1, err, "context deadline")
	}
	return Wrap(ErrAborted, -1, err, "context canceled")
}

// ForPeer makes sure a transport failure names the peer it concerns: an
// *Error is returned as it is, anything else becomes ErrPeerLost for peer.
func ForPeer(peer int, err error) error {
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	return Wrap(ErrPeerLost, peer, err, "transport")
}
