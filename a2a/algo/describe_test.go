package algo

import (
	"errors"
	"testing"
)

func TestDescribe(t *testing.T) {
	// Rank 0 of 3: self 5 bytes, 10 bytes to 1 (two 7-byte-block frames), 3 to
	// 2; receives 4 from 1 and 0 from 2.
	a := AllToAllVArgs{Rank: 0, World: 3, SendCounts: []int{5, 10, 3}, RecvCounts: []int{5, 4, 0}, Streams: 2, Window: 2, BlockSize: 7}
	var s Schedule
	if err := PlanPairwise(&s, a); err != nil {
		t.Fatal(err)
	}
	// Pairwise puts frame f of each direction in sub-round f of a distance.
	want := `pairwise: 3 rounds, 6 steps, scratch 0 B
round 0: send 7 B, recv 0 B, copy 5 B
  copy send -> recv: 5 B
  send -> 1: 7 B in 1 frame
  recv <- 2: 0 B in 1 frame
round 1: send 3 B, recv 0 B, copy 0 B
  send -> 1: 3 B in 1 frame
round 2: send 3 B, recv 4 B, copy 0 B
  send -> 2: 3 B in 1 frame
  recv <- 1: 4 B in 1 frame
`
	if got := s.String(); got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}
	if err := PlanFullmesh(&s, a); err != nil {
		t.Fatal(err)
	}
	want = `fullmesh: 2 rounds, 6 steps, scratch 0 B
round 0: send 10 B, recv 4 B, copy 5 B
  copy send -> recv: 5 B
  send -> 1: 7 B in 1 frame
  recv <- 2: 0 B in 1 frame
  send -> 2: 3 B in 1 frame
  recv <- 1: 4 B in 1 frame
round 1: send 3 B, recv 0 B, copy 0 B
  send -> 1: 3 B in 1 frame
`
	if got := s.String(); got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}
	if err := s.Describe(failWriter{}); !errors.Is(err, errWrite) {
		t.Fatalf("Describe on a failing writer = %v", err)
	}
}

var errWrite = errors.New("write failed")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errWrite }
