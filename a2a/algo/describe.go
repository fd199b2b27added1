package algo

import (
	"fmt"
	"io"
	"strings"
)

// String is a one-line description of a step, for errors and logs.
func (st Step) String() string {
	last := ""
	if st.Last {
		last = " last"
	}
	switch st.Kind {
	case StepSend:
		return fmt.Sprintf("send %v[%d:%d] to %d stream %d%s", st.Src.Buf, st.Src.Off, st.Src.End(), st.Peer, st.Stream, last)
	case StepRecv:
		return fmt.Sprintf("recv %v[%d:%d] from %d stream %d%s", st.Dst.Buf, st.Dst.Off, st.Dst.End(), st.Peer, st.Stream, last)
	case StepRecvReduce:
		with := ""
		if st.With.Len > 0 {
			order := ""
			if st.LandedFirst {
				order = " (landed first)"
			}
			with = fmt.Sprintf(" with %v[%d:%d]%s", st.With.Buf, st.With.Off, st.With.End(), order)
		}
		return fmt.Sprintf("recvreduce %v[%d:%d] from %d stream %d into %v[%d:%d]%s%s", st.Src.Buf, st.Src.Off, st.Src.End(), st.Peer, st.Stream, st.Dst.Buf, st.Dst.Off, st.Dst.End(), with, last)
	case StepStore:
		if st.CountOnly {
			return fmt.Sprintf("store length %d to %d", st.Src.Len, st.Peer)
		}
		return fmt.Sprintf("store %v[%d:%d] to %d", st.Src.Buf, st.Src.Off, st.Src.End(), st.Peer)
	case StepLoad:
		if st.CountOnly {
			return fmt.Sprintf("load length %d from %d", st.Dst.Len, st.Peer)
		}
		return fmt.Sprintf("load %v[%d:%d] from %d", st.Dst.Buf, st.Dst.Off, st.Dst.End(), st.Peer)
	default:
		return fmt.Sprintf("%v %v[%d:%d] -> %v[%d:%d]", st.Kind, st.Src.Buf, st.Src.Off, st.Src.End(), st.Dst.Buf, st.Dst.Off, st.Dst.End())
	}
}

// Describe writes a human-readable summary of the schedule (for `a2ad plan`):
// a header, then per round the bytes sent, received, copied and reduced (a
// RecvReduce counts as received and reduced), and the messages of the round,
// consecutive frames of one message folded into one line.
func (s *Schedule) Describe(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("%v: %s, %s, scratch %d B\n", s.Algo, plural(s.NumRounds(), "round"), plural(len(s.Steps), "step"), s.ScratchBytes)
	for i := 0; i < s.NumRounds(); i++ {
		steps := s.Round(i)
		var tot [StepRecvReduce + 1]int
		ll := 0
		for _, st := range steps {
			switch {
			case int(st.Kind) < len(tot):
				tot[st.Kind] += stepBytes(st)
			case (st.Kind == StepStore || st.Kind == StepLoad) && !st.CountOnly:
				ll += stepBytes(st)
			}
		}
		tot[StepRecv] += tot[StepRecvReduce]
		tot[StepReduce] += tot[StepRecvReduce]
		ew.printf("round %d: send %d B, recv %d B, copy %d B", i, tot[StepSend], tot[StepRecv], tot[StepCopy])
		if ll > 0 {
			ew.printf(", LL %d B", ll)
		}
		if tot[StepReduce] > 0 {
			ew.printf(", reduce %d B", tot[StepReduce])
		}
		ew.printf("\n")
		for j := 0; j < len(steps); {
			k := j + 1
			for k < len(steps) && steps[k].Kind == steps[j].Kind && steps[k].Peer == steps[j].Peer && !steps[k-1].Last {
				k++
			}
			bytes := 0
			for _, st := range steps[j:k] {
				bytes += stepBytes(st)
			}
			frames := plural(k-j, "frame")
			switch st := steps[j]; st.Kind {
			case StepSend:
				ew.printf("  send -> %d: %d B in %s\n", st.Peer, bytes, frames)
			case StepRecv:
				ew.printf("  recv <- %d: %d B in %s\n", st.Peer, bytes, frames)
			case StepRecvReduce:
				ew.printf("  recvreduce <- %d: %d B in %s into %v\n", st.Peer, bytes, frames, st.Dst.Buf)
			case StepStore, StepLoad:
				dir, what := "store ->", "B"
				if st.Kind == StepLoad {
					dir = "load <-"
				}
				if st.CountOnly {
					what = "B by frames (length only)"
				}
				ew.printf("  %s %d: %d %s\n", dir, st.Peer, bytes, what)
				k = j + 1
			default:
				ew.printf("  %v %v -> %v: %d B\n", st.Kind, st.Src.Buf, st.Dst.Buf, bytes)
				k = j + 1
			}
			j = k
		}
	}
	return ew.err
}

// String is Describe into a string.
func (s *Schedule) String() string {
	var b strings.Builder
	_ = s.Describe(&b) // a strings.Builder does not fail
	return b.String()
}

func stepBytes(st Step) int {
	if st.Kind == StepSend || st.Kind == StepRecvReduce || st.Kind == StepStore {
		return st.Src.Len
	}
	return st.Dst.Len
}

// errWriter keeps the first write error so Describe checks it once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
