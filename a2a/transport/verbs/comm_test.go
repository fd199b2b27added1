package verbs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/a2atest"
	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/a2a/transport/verbs"
)

// The Comm tests over verbs: ranks are processes (this test binary run
// again as TestCommRank), joined through an embedded NATS server with
// A2A_TRANSPORT=verbs semantics (Config.Transport "verbs"). They share the
// lab's host, so their local ranks spread them over rxe0 and rxe1: ranks of
// different parity talk across the veth pair.

const childEnv = "A2A_VERBS_TEST_CHILD" // mode of a child rank: "ops" or "kill"

func needLab(t *testing.T) {
	t.Helper()
	if os.Getenv("A2A_RDMA_LAB") != "1" {
		t.Skip("needs RDMA devices: runs in the lab (make test-rdma sets A2A_RDMA_LAB=1)")
	}
}

// child is one rank process, its stdout lines arriving on lines.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser // closing it releases a rank that waits for it
	lines chan string
	errb  bytes.Buffer
	out   strings.Builder // the stdout lines await saw
	done  chan error
}

// startRanks starts n ranks in mode; env adds variables by rank (nil: none).
func startRanks(t *testing.T, mode string, n int, env func(r int) []string) []*child {
	url := a2atest.StartNATS(t)
	group := fmt.Sprintf("verbs-%s-%d", mode, os.Getpid())
	kids := make([]*child, n)
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCommRank$", "-test.count=1", "-test.timeout=120s")
		cmd.Env = append(os.Environ(), childEnv+"="+mode, "A2A_NATS_URL="+url, "A2A_GROUP="+group,
			"A2A_RANK="+strconv.Itoa(r), "A2A_WORLD_SIZE="+strconv.Itoa(n), "A2A_SECRET=verbs-comm-test")
		if env != nil {
			cmd.Env = append(cmd.Env, env(r)...)
		} else {
			cmd.Env = append(cmd.Env, "A2A_TRANSPORT=verbs")
		}
		k := &child{cmd: cmd, lines: make(chan string, 64), done: make(chan error, 1)}
		cmd.Stderr = &k.errb
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if k.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
			k.done <- cmd.Wait()
		}()
		t.Cleanup(func() { cmd.Process.Kill() })
		kids[r] = k
	}
	return kids
}

// await waits for a line starting with prefix from k.
func (k *child) await(t *testing.T, r int, prefix string, d time.Duration) string {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-k.lines:
			if !ok {
				t.Fatalf("rank %d ended before %q: %v\n%s%s", r, prefix, <-k.done, k.out.String(), k.errb.String())
			}
			k.out.WriteString(line + "\n")
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("rank %d: no %q within %v\n%s%s", r, prefix, d, k.out.String(), k.errb.String())
		}
	}
}

// TestCommOverVerbs runs the collectives between 3 rank processes over
// verbs, every byte checked in the ranks, and finds no verbs object left
// once they are gone.
func TestCommOverVerbs(t *testing.T) {
	needLab(t)
	before := rdmaTotals(t)
	kids := startRanks(t, "ops", 3, nil)
	t.Cleanup(func() {
		if t.Failed() {
			for r, k := range kids {
				k.cmd.Process.Kill()
				time.Sleep(100 * time.Millisecond)
				t.Logf("rank %d's stderr:\n%s", r, k.errb.String())
			}
		}
	})
	for r, k := range kids {
		line := k.await(t, r, "ok", 120*time.Second)
		t.Logf("rank %d: %s", r, line)
		if err := <-k.done; err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, k.errb.String())
		}
	}
	if after := rdmaTotals(t); after != before {
		t.Errorf("verbs objects %v before, %v after the ranks exited", before, after)
	}
}

// TestCommMixed runs the same collectives on 4 ranks posing as two hosts of
// two (A2A_HOST) under auto selection: shared memory inside a host, verbs
// between them, composed by transport.Mixed, whose parking takes turns
// between shm's futex and verbs' completion channel.
func TestCommMixed(t *testing.T) {
	needLab(t)
	kids := startRanks(t, "mixed", 4, func(r int) []string {
		return []string{"A2A_HOST=lab-host-" + strconv.Itoa(r/2), "A2A_TRANSPORT=auto"}
	})
	for r, k := range kids {
		line := k.await(t, r, "ok", 120*time.Second)
		t.Logf("rank %d: %s", r, line)
		if err := <-k.done; err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, k.errb.String())
		}
	}
}

// TestCommKilledRank kills one of 3 ranks with SIGKILL while they run
// AllToAllV over verbs: the others fail with ErrPeerLost (typed), within
// seconds, close, and hold no QP or MR afterwards; nothing is left once all
// are gone.
func TestCommKilledRank(t *testing.T) {
	needLab(t)
	before := rdmaTotals(t)
	kids := startRanks(t, "kill", 3, nil)
	for r, k := range kids {
		k.await(t, r, "running", 60*time.Second)
	}
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	if err := kids[2].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for r, k := range kids[:2] {
		line := k.await(t, r, "lost", 30*time.Second)
		after := time.Since(killed)
		t.Logf("rank %d, %v after the kill: %s", r, after, line)
		// The control plane declares a silent rank lost after 1.5 s; the
		// QPs to it fail after their retries (about 1 s). A loaded lab
		// guest adds scheduling delay on top.
		if after > 6*time.Second {
			t.Errorf("rank %d noticed the kill after %v", r, after)
		}
		if err := <-k.done; err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, k.errb.String())
		}
	}
	<-kids[2].done
	if after := rdmaTotals(t); after != before {
		t.Errorf("verbs objects %v before, %v after the ranks exited", before, after)
	}
}

// mismatchEnv gives the "mismatch" child ranks their case: "sent,exp".
const mismatchEnv = "A2A_VERBS_TEST_MISMATCH"

// TestCommLLMismatch: under auto selection verbs pairs are quiet (a block
// above the LL cutoff goes by frames without announcing its length first),
// yet two ranks that disagree about a block's length, in either direction
// across the cutoff, fail with ErrMismatch within seconds: the receiver of
// frames sees the peer's LL store in its slot (verbs Stored), a Load sees a
// frame, a frame header its length. Rank 1 sends rank 0 sent bytes, rank 0
// expects exp.
func TestCommLLMismatch(t *testing.T) {
	needLab(t)
	for _, tc := range []struct {
		name      string
		sent, exp int
	}{
		{"small-small", 10, 12},
		{"small-large", 10, 9000},
		{"large-small", 9000, 10},
		{"large-large", 9000, 9001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kids := startRanks(t, "mismatch", 2, func(int) []string {
				return []string{"A2A_TRANSPORT=verbs", fmt.Sprintf("%s=%d,%d", mismatchEnv, tc.sent, tc.exp)}
			})
			for r, k := range kids {
				// "result KIND SECONDS": KIND nil, mismatch, aborted or
				// other; the error goes to stderr.
				f := strings.Fields(k.await(t, r, "result", 60*time.Second))
				if len(f) != 3 {
					t.Fatalf("rank %d: %q", r, strings.Join(f, " "))
				}
				kind, took := f[1], f[2]
				t.Logf("rank %d: %s after %s s", r, kind, took)
				if d, err := strconv.ParseFloat(took, 64); err != nil || d > 5 {
					t.Errorf("rank %d released after %s s", r, took)
				}
				switch {
				case r == 0 && kind != "mismatch":
					t.Errorf("rank 0: %s, want ErrMismatch\n%s", kind, k.errb.String())
				case r == 1 && kind != "nil" && kind != "aborted" && kind != "mismatch":
					t.Errorf("rank 1: %s, want nil, ErrAborted or ErrMismatch\n%s", kind, k.errb.String())
				}
			}
			for _, k := range kids {
				k.stdin.Close() // both have reported: let them close
			}
			for r, k := range kids {
				k.await(t, r, "ok", 30*time.Second)
				if err := <-k.done; err != nil {
					t.Fatalf("rank %d: %v\n%s", r, err, k.errb.String())
				}
			}
		})
	}
}

// TestCommRank is one rank of the tests above; it runs only as their child.
func TestCommRank(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("a child rank of TestCommOverVerbs, TestCommMixed, TestCommKilledRank and TestCommLLMismatch")
	}
	cfg, err := a2a.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if mode != "kill" {
		// A loaded lab guest can stall a rank for a second; the kill test
		// keeps the defaults, which it is about.
		cfg.PeerTimeout = 5 * time.Second
	}
	if mode == "mismatch" {
		cfg.Algo = "" // auto, whatever A2A_ALGO says: the quiet pairs are its
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := a2a.Join(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ops": "verbs", "kill": "verbs", "mixed": "shm+verbs", "mismatch": "verbs"}[mode]
	if c.TransportName() != want {
		t.Fatalf("transport %q, want %s", c.TransportName(), want)
	}
	switch mode {
	case "ops", "mixed":
		rankOps(ctx, t, c)
	case "kill":
		rankUntilLost(ctx, t, c)
	case "mismatch":
		rankMismatch(ctx, t, c)
	}
	// After a kill or a mismatch the group is gone or aborted: Close may
	// say so, but must still release every verbs object.
	if err := c.Close(); err != nil && mode != "kill" && mode != "mismatch" {
		t.Fatal(err)
	}
	if n := ownVerbsObjects(t); n != 0 {
		t.Fatalf("%d QPs and MRs of this process left after Close", n)
	}
	fmt.Println("ok", mode)
}

// block is the deterministic content rank src sends rank dst in round k.
func block(src, dst, k, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(src*31 + dst*7 + k*3 + i + i>>8)
	}
	return b
}

func rankOps(ctx context.Context, t *testing.T, c *a2a.Comm) {
	me, p := c.Rank(), c.Size()
	for q := range p {
		want := "verbs"
		if c.Host(q) == c.Host(me) && c.TransportName() != "verbs" {
			want = "shm"
		}
		if q != me && c.PeerTransport(q) != want {
			t.Fatalf("rank %d: pair with %d on %q, want %s", me, q, c.PeerTransport(q), want)
		}
	}
	// AllToAllV: uneven blocks from empty to several 512 KiB frames, from
	// the Go heap (bounce buffers) and from AllocBuffer (zero-copy).
	size := func(src, dst, k int) int {
		if (src+dst+k)%3 == 0 {
			return 700<<10 + src*10 + dst
		}
		return (src*37 + dst*11 + k*5) % 9 * 1000
	}
	for k, alloc := range []bool{false, true, false, true} {
		sc, rc := make([]int, p), make([]int, p)
		var sb, rb []byte
		for q := range p {
			sc[q], rc[q] = size(me, q, k), size(q, me, k)
			sb = append(sb, block(me, q, k, sc[q])...)
		}
		for q := range p {
			rb = append(rb, make([]byte, rc[q])...)
		}
		if alloc {
			sb, rb = allocCopy(t, sb), allocCopy(t, rb)
		}
		fmt.Fprintln(os.Stderr, "AllToAllV round", k)
		if err := c.AllToAllV(ctx, sb, sc, rb, rc); err != nil {
			t.Fatalf("AllToAllV round %d: %v", k, err)
		}
		off := 0
		for q := range p {
			if !bytes.Equal(rb[off:off+rc[q]], block(q, me, k, rc[q])) {
				t.Fatalf("AllToAllV round %d (AllocBuffer %v): block from rank %d wrong", k, alloc, q)
			}
			off += rc[q]
		}
	}

	// AllReduce of floats small (recursive doubling) and large (ring,
	// segmented), AllGather, ReduceScatter, Broadcast, Reduce, Gather,
	// Scatter, Barrier, Send/Recv.
	for _, n := range []int{8, 300 << 10} {
		in, out := make([]byte, 4*n), make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(me*1000+i%997)))
		}
		fmt.Fprintln(os.Stderr, "AllReduce")
		if err := c.AllReduce(ctx, in, out, reduce.Float32, reduce.Sum); err != nil {
			t.Fatalf("AllReduce %d: %v", n, err)
		}
		for i := range n {
			want := float32(p*(p-1)/2*1000 + p*(i%997))
			if got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); got != want {
				t.Fatalf("AllReduce %d: element %d is %v, want %v", n, i, got, want)
			}
		}
	}
	const part = 100<<10 + 3
	all := make([]byte, p*part)
	fmt.Fprintln(os.Stderr, "AllGather")
	if err := c.AllGather(ctx, block(me, 0, 9, part), all); err != nil {
		t.Fatal(err)
	}
	for q := range p {
		if !bytes.Equal(all[q*part:(q+1)*part], block(q, 0, 9, part)) {
			t.Fatalf("AllGather: part of rank %d wrong", q)
		}
	}
	rs := make([]byte, 4*1024)
	in := make([]byte, 4*1024*p)
	for i := range 1024 * p {
		binary.LittleEndian.PutUint32(in[4*i:], uint32(i+me))
	}
	fmt.Fprintln(os.Stderr, "ReduceScatter")
	if err := c.ReduceScatter(ctx, in, rs, reduce.Int32, reduce.Sum); err != nil {
		t.Fatal(err)
	}
	for i := range 1024 {
		if got, want := binary.LittleEndian.Uint32(rs[4*i:]), uint32(p*(me*1024+i)+p*(p-1)/2); got != want {
			t.Fatalf("ReduceScatter: element %d is %d, want %d", i, got, want)
		}
	}
	bc := make([]byte, 600<<10)
	if me == 1 {
		copy(bc, block(1, 1, 10, len(bc)))
	}
	fmt.Fprintln(os.Stderr, "Broadcast")
	if err := c.Broadcast(ctx, bc, 1); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bc, block(1, 1, 10, len(bc))) {
		t.Fatal("Broadcast: data wrong")
	}
	red := make([]byte, 8)
	one := make([]byte, 8)
	binary.LittleEndian.PutUint64(one, uint64(me+1))
	fmt.Fprintln(os.Stderr, "Reduce")
	if err := c.Reduce(ctx, one, red, reduce.Int64, reduce.Prod, 2); err != nil {
		t.Fatal(err)
	}
	if want := uint64(1); me == 2 {
		for q := range p {
			want *= uint64(q + 1)
		}
		if got := binary.LittleEndian.Uint64(red); got != want {
			t.Fatalf("Reduce: %d, want %d", got, want)
		}
	}
	g := make([]byte, p*5000)
	fmt.Fprintln(os.Stderr, "Gather")
	if err := c.Gather(ctx, block(me, 0, 11, 5000), g, 0); err != nil {
		t.Fatal(err)
	}
	sc := make([]byte, 5000)
	fmt.Fprintln(os.Stderr, "Scatter")
	if err := c.Scatter(ctx, g, sc, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sc, block(me, 0, 11, 5000)) {
		t.Fatal("Gather then Scatter: data wrong")
	}
	fmt.Fprintln(os.Stderr, "Barrier")
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	// Point-to-point around the ring: rank 0 sends first, the others pass
	// on what they receive (a Comm runs one operation at a time).
	fmt.Fprintln(os.Stderr, "Send/Recv")
	msg := block(me, (me+1)%p, 12, 70<<10)
	got := make([]byte, len(msg))
	if me == 0 {
		if err := c.Send(ctx, msg, 1, 7); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Recv(ctx, got, (me+p-1)%p, 7); err != nil {
		t.Fatal(err)
	}
	if me != 0 {
		if err := c.Send(ctx, msg, (me+1)%p, 7); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, block((me+p-1)%p, me, 12, len(got))) {
		t.Fatal("Send/Recv: data wrong")
	}
	st := c.Stats()
	for q := range p {
		if q != me && (st.BytesSent[q] < 700<<10 || st.BytesReceived[q] < 700<<10) {
			t.Fatalf("stats to rank %d: %d sent, %d received", q, st.BytesSent[q], st.BytesReceived[q])
		}
	}
}

// allocCopy copies b into AllocBuffer memory, freed at the end of the test.
func allocCopy(t *testing.T, b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	m, err := a2a.AllocBuffer(len(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a2a.FreeBuffer(m) })
	copy(m, b)
	return m
}

// rankUntilLost runs AllToAllV until it fails, which must be ErrPeerLost.
func rankUntilLost(ctx context.Context, t *testing.T, c *a2a.Comm) {
	p := c.Size()
	counts := make([]int, p)
	for q := range counts {
		counts[q] = 4096
	}
	send, recv := make([]byte, 4096*p), make([]byte, 4096*p)
	fmt.Println("running")
	for {
		if err := c.AllToAllV(ctx, send, counts, recv, counts); err != nil {
			if !errors.Is(err, a2a.ErrPeerLost) {
				t.Fatalf("AllToAllV: %v, want ErrPeerLost", err)
			}
			fmt.Println("lost:", err)
			return
		}
	}
}

// rankMismatch runs one AllToAllV in which rank 1 sends rank 0 a block of
// another length than rank 0 expects (mismatchEnv) and prints what it
// returned and after how long.
func rankMismatch(ctx context.Context, t *testing.T, c *a2a.Comm) {
	var sent, exp int
	if _, err := fmt.Sscanf(os.Getenv(mismatchEnv), "%d,%d", &sent, &exp); err != nil {
		t.Fatalf("%s=%q: %v", mismatchEnv, os.Getenv(mismatchEnv), err)
	}
	// Hung, the ranks would wait this long: far beyond what the test allows.
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	sc, rc := []int{0, 0}, []int{0, 0}
	if c.Rank() == 1 {
		sc[0] = sent
	} else {
		rc[1] = exp
	}
	start := time.Now()
	err := c.AllToAllV(ctx, make([]byte, sc[0]), sc, make([]byte, rc[1]), rc)
	took := time.Since(start)
	kind := "other"
	switch {
	case err == nil:
		kind = "nil"
	case errors.Is(err, a2a.ErrMismatch):
		kind = "mismatch"
	case errors.Is(err, a2a.ErrAborted):
		kind = "aborted"
	}
	fmt.Fprintln(os.Stderr, "AllToAllV:", err)
	fmt.Printf("result %s %.3f\n", kind, took.Seconds())
	// A rank that finished keeps its transport until the test has both
	// results: its Close would fail a hung peer with ErrPeerLost, hiding
	// the hang (a rank of a job goes on to its next operation instead).
	io.Copy(io.Discard, os.Stdin)
}

// rdmaTotals is the number of QPs, MRs, CQs, PDs and contexts on every
// device (rdma resource show), as the package's own leak tests count them.
func rdmaTotals(t *testing.T) [5]int {
	t.Helper()
	var n [5]int
	for _, counts := range verbs.RDMAResources(t) {
		for i, k := range []string{"qp", "mr", "cq", "pd", "ctx"} {
			n[i] += counts[k]
		}
	}
	return n
}

// ownVerbsObjects counts the QPs and MRs this process holds.
func ownVerbsObjects(t *testing.T) int {
	n := 0
	for _, kind := range []string{"qp", "mr"} {
		out, err := exec.Command("rdma", "-j", "resource", "show", kind).Output()
		if err != nil {
			t.Fatalf("rdma resource show %s: %v", kind, err)
		}
		var rows []map[string]any
		if err := json.Unmarshal(out, &rows); err != nil {
			t.Fatalf("rdma resource show %s: %v: %s", kind, err, out)
		}
		for _, r := range rows {
			if pid, _ := r["pid"].(float64); int(pid) == os.Getpid() {
				n++
			}
		}
	}
	return n
}

// TestCommJoinCloseCycles: 100 cycles of Join, a verified AllToAll and Close
// of two in-process ranks forced onto verbs (one on each device) leave no
// queue pair, memory region, completion queue or protection domain behind.
func TestCommJoinCloseCycles(t *testing.T) {
	needLab(t)
	url := a2atest.StartNATS(t)
	before := rdmaTotals(t)
	start := time.Now()
	const cycles = 100
	for i := range cycles {
		comms := a2atest.Group(t, url, 2, func(c *a2a.Config) { c.Transport = "verbs" })
		errs := make(chan error, len(comms))
		for _, c := range comms {
			go func() {
				send, recv := []byte{byte(c.Rank()), byte(c.Rank())}, make([]byte, 2)
				err := c.AllToAll(context.Background(), send, recv)
				if err == nil && (recv[0] != 0 || recv[1] != 1) {
					err = fmt.Errorf("rank %d got %v, want [0 1]", c.Rank(), recv)
				}
				errs <- err
			}()
		}
		for range comms {
			if err := <-errs; err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Fatalf("cycle %d: Close: %v", i, err)
			}
		}
	}
	t.Logf("%v per Join, AllToAll and Close", time.Since(start)/cycles)
	if after := rdmaTotals(t); after != before {
		t.Errorf("verbs objects (qp, mr, cq, pd, ctx) %v before, %v after %d cycles", before, after, cycles)
	}
}
