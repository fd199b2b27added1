package transporttest

import (
	"bytes"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport"
)

// OneOpPerDirection checks that a conn leaves a second op untouched while
// the first one owns the direction, in both directions: ts[0] sends big and
// then a short message to ts[1] on stream 0, and each side tries its second
// op after one try of its first. big must be too large for the transport to
// take or deliver in one try. progress says the first tries must also move
// bytes (a transport whose first try may legitimately move none passes
// false).
func OneOpPerDirection[T transport.Transport](t testing.TB, ts []T, big []byte, progress bool) {
	t.Helper()
	c0, c1 := ts[0].Conn(1, 0), ts[1].Conn(0, 0)
	first := SendJob(c0, Hdr(0, 0, 0, 1), big)
	second := SendJob(c0, Hdr(0, 0, 1, 1), []byte("second"))
	if done, err := c0.TrySend(first.Send); done || err != nil || progress && first.Send.Progress == 0 {
		t.Fatalf("first send of %d bytes: done %v err %v progress %d, want partial progress", len(big), done, err, first.Send.Progress)
	}
	if done, err := c0.TrySend(second.Send); done || err != nil || second.Send.Started || second.Send.Progress != 0 {
		t.Fatalf("second send while the first owns the conn: done %v err %v started %v", done, err, second.Send.Started)
	}
	r1 := RecvJob(c1, Hdr(0, 0, 0, 1), make([]byte, len(big)))
	r2 := RecvJob(c1, Hdr(0, 0, 1, 1), make([]byte, 6))
	if done, err := c1.TryRecv(r1.Recv); done || err != nil || progress && r1.Recv.Progress == 0 {
		t.Fatalf("first receive: done %v err %v progress %d", done, err, r1.Recv.Progress)
	}
	if done, err := c1.TryRecv(r2.Recv); done || err != nil || r2.Recv.Started {
		t.Fatalf("second receive while the first owns the conn: done %v err %v started %v", done, err, r2.Recv.Started)
	}
	if err := FirstErr(DriveAll(ts, [][]Job{{first, second}, {r1, r2}}, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r1.Recv.Dst, big) || string(r2.Recv.Dst) != "second" {
		t.Fatal("payloads corrupted")
	}
}
