package verbs_test

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/a2a-moe/a2a/verbs"
	"golang.org/x/sys/unix"
)

// This example connects two RC queue pairs on the first usable port to each other and moves a
// message from one to the other with an RDMA WRITE WITH IMM. Between two hosts each side
// does the same with its own QP, and they exchange their QPs' Addrs, and the target
// region's address and RKey, over a connection of their own.
func Example() {
	got, imm, err := writeWithImm([]byte("hello over RDMA"), 42)
	if errors.Is(err, verbs.ErrUnavailable) {
		fmt.Println("no RDMA here:", err) // fall back to another way of moving data
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("received %q with immediate %d\n", got, imm)
}

// writeWithImm writes msg from one QP into the other's half of a registered buffer with
// an RDMA WRITE WITH IMM carrying imm, and returns what arrived and the immediate.
func writeWithImm(msg []byte, imm uint32) ([]byte, uint32, error) {
	lib, err := verbs.Load()
	if err != nil {
		return nil, 0, err
	}
	eps, err := lib.Endpoints(verbs.Config{GIDIndex: verbs.AutoGIDIndex})
	if err != nil {
		return nil, 0, err
	}
	ep := eps[0] // the first active port, addressed by its RoCE v2 GID (or LID)
	ctx, err := lib.Open(ep.Device)
	if err != nil {
		return nil, 0, err
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, 0, err
	}
	defer pd.Close()

	// Registered memory must not belong to the Go heap: map it.
	const half = 4096
	buf, err := unix.Mmap(-1, 0, 2*half, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Munmap(buf)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return nil, 0, err
	}
	defer mr.Close()

	ch, err := ctx.NewCompChannel()
	if err != nil {
		return nil, 0, err
	}
	defer ch.Close()
	cq, err := ctx.NewCQ(16, ch)
	if err != nil {
		return nil, 0, err
	}
	defer cq.Close()
	sender, receiver, err := connectedPair(pd, cq, ep)
	if err != nil {
		return nil, 0, err
	}
	defer sender.Close()
	defer receiver.Close()

	// A write with immediate consumes a receive at the target, which needs no SGE: the
	// data goes where the writer says.
	if err := receiver.PostRecv(1, nil); err != nil {
		return nil, 0, err
	}
	copy(buf, msg)
	wr := verbs.SendWR{ID: 2, Op: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: imm,
		RemoteAddr: mr.Addr() + half, RKey: mr.RKey()}
	if err := sender.PostSend(wr, []verbs.SGE{mr.SGE(0, len(msg))}); err != nil {
		return nil, 0, err
	}
	wcs, err := completions(cq, 2) // the write's and the receive's
	if err != nil {
		return nil, 0, err
	}
	for _, wc := range wcs {
		if wc.Opcode == verbs.WCRecvRDMAWithImm {
			return bytes.Clone(buf[half : half+int(wc.ByteLen)]), wc.Imm(), nil
		}
	}
	return nil, 0, fmt.Errorf("no receive among the completions %+v", wcs)
}

// connectedPair creates two RC QPs that complete into cq and connects them to each other
// on ep's port.
func connectedPair(pd *verbs.PD, cq *verbs.CQ, ep verbs.Endpoint) (a, b *verbs.QP, err error) {
	if a, err = pd.NewRCQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq}); err != nil {
		return nil, nil, err
	}
	if b, err = pd.NewRCQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq}); err != nil {
		a.Close()
		return nil, nil, err
	}
	psnA, psnB := verbs.RandomPSN(), verbs.RandomPSN()
	err = a.Connect(ep, psnA, b.Addr(ep, psnB), verbs.ConnectOptions{})
	if err == nil {
		err = b.Connect(ep, psnB, a.Addr(ep, psnA), verbs.ConnectOptions{})
	}
	if err != nil {
		a.Close()
		b.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// completions waits for n completions on cq, parking on its completion channel, and
// returns them. A failed completion is an error.
func completions(cq *verbs.CQ, n int) ([]verbs.WC, error) {
	wcs := make([]verbs.WC, n)
	deadline := time.Now().Add(30 * time.Second)
	for got := 0; got < n; {
		k, err := cq.Wait(wcs[got:], -1, time.Second)
		if err != nil {
			return nil, err
		}
		for _, wc := range wcs[got : got+k] {
			if err := wc.Err(); err != nil {
				return nil, err
			}
		}
		if got += k; got < n && time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d completions within 30 s", got, n)
		}
	}
	return wcs, nil
}
