package transport

import "github.com/a2a-moe/a2a/a2a/internal/fault"

// side is the state machine SendSide and RecvSide share: which op owns the
// direction, and the sticky error. An op is only ever set while err is nil
// (Finish clears it when it sets err), so the two never hold together.
type side[O any] struct {
	op  *O
	err error
}

// enter is the part of Claim every direction shares. claim is true when the
// direction is idle and op must be validated and take it; otherwise ok and
// err are Claim's answer: ok for the op that owns the direction already, not
// ok while another op owns it, and the sticky error of an earlier failure.
func (s *side[O]) enter(op *O) (claim, ok bool, err error) {
	switch {
	case s.op == op:
		return false, true, nil
	case s.op != nil:
		return false, false, nil
	case s.err != nil:
		return false, false, s.err
	}
	return true, false, nil
}

// Finish ends the owning op's turn when it is done or failed (err sticks)
// and reports whether the direction was released.
func (s *side[O]) Finish(done bool, err error) bool {
	if !done && err == nil {
		return false
	}
	s.op, s.err = nil, err
	return true
}

// SendSide is the send direction of one Conn as every transport keeps it:
// the first SendOp passed owns the direction until it is done, other ops wait
// (Conn's contract), and the first failure sticks, since the stream's framing
// is lost after it. The zero value is an idle direction. Finish comes from
// the state machine it shares with RecvSide.
type SendSide struct {
	side[SendOp]
}

// Claim reports whether op may progress now. It returns (false, nil) while
// another op owns the direction, and the sticky error of an earlier failure
// or the reason op is malformed. fresh is true when op has just taken the
// direction: its progress is reset and its header encoded into op.Wire. name
// prefixes error messages ("tcp", "shm").
func (s *SendSide) Claim(op *SendOp, peer int, name string) (fresh, ok bool, err error) {
	if claim, ok, err := s.enter(op); !claim {
		return false, ok, err
	}
	if n := op.payloadLen(); op.Hdr.Len != uint64(n) {
		return false, false, fault.New(fault.ErrInvalidArgument, peer,
			"%s: send header says %d bytes for a %d-byte payload", name, op.Hdr.Len, n)
	}
	op.Hdr.Encode(op.Wire[:])
	op.Progress = 0
	op.Started = true
	s.op = op
	return true, true, nil
}

// payloadLen counts Vec's bytes, which Claim checks against the header.
func (op *SendOp) payloadLen() int {
	if op.Vec != nil {
		return VecLen(op.Vec)
	}
	return len(op.Data)
}

// RecvSide is the receive direction of one Conn, with the same rules as
// SendSide (Finish included).
type RecvSide struct {
	side[RecvOp]
}

// Claim reports whether op may progress now (see SendSide.Claim). A fresh
// op has its progress and received header reset.
func (s *RecvSide) Claim(op *RecvOp, peer int, name string) (fresh, ok bool, err error) {
	if claim, ok, err := s.enter(op); !claim {
		return false, ok, err
	}
	if op.DstVec != nil && (op.AnyLen || op.Window != nil || op.Want.Len != uint64(VecLen(op.DstVec))) {
		return false, false, fault.New(fault.ErrInvalidArgument, peer,
			"%s: a scattered receive takes exactly its %d bytes, no window", name, VecLen(op.DstVec))
	}
	if op.Window == nil && op.DstVec == nil && op.Want.Len > uint64(len(op.Dst)) {
		return false, false, fault.New(fault.ErrInvalidArgument, peer,
			"%s: receive of %d bytes into a %d-byte buffer", name, op.Want.Len, len(op.Dst))
	}
	op.Progress = 0
	op.Started = true
	op.N = 0
	op.Got = Header{}
	s.op = op
	return true, true, nil
}
