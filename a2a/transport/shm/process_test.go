package shm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/transporttest"
)

// Helper processes: the test binary re-executed with helperEnv set runs
// helperMain (from TestMain) as rank 1 of a 2-rank group whose rank 0 is the
// test. It reports on stdout: "ready" once it reached the state the test
// wants, results as "key=value" lines.
const (
	helperEnv   = "A2A_SHM_HELPER" // the mode
	helperGroup = "A2A_SHM_GROUP"
	helperDir   = "A2A_SHM_DIR"
	helperZCopy = "A2A_SHM_ZCOPY"
	helperProbe = "A2A_SHM_NOPROBE"
	helperBench = "A2A_SHM_BENCH" // size:iterations:ring
	helperSlot  = "A2A_SHM_SLOT"  // Config.SlotBytes
	helperMap   = "A2A_SHM_MAP"   // bench: send from a shareable buffer
)

// helperSize is the message the helpers stall in the middle of: far more
// than the ring.
const helperSize = 8 << 20

// echoSizes are the messages the echo helper receives and sends back.
var echoSizes = []int{1 << 20, 100 << 10, 1}

// helperMain runs a helper process and returns its exit code.
func helperMain() int {
	mode := os.Getenv(helperEnv)
	fail := func(err error) int {
		fmt.Printf("error=%v\n", err)
		return 1
	}
	zcopy, _ := strconv.Atoi(os.Getenv(helperZCopy))
	var size, iters, ring int
	fmt.Sscanf(os.Getenv(helperBench), "%d:%d:%d", &size, &iters, &ring)
	if ring == 0 {
		ring = testRing
	}
	slot, _ := strconv.Atoi(os.Getenv(helperSlot))
	cfg := Config{
		Group:          os.Getenv(helperGroup),
		Epoch:          testEpoch,
		Rank:           1,
		Size:           2,
		RingBytes:      ring,
		Dir:            os.Getenv(helperDir),
		ZCopyThreshold: zcopy,
		SlotBytes:      slot,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, nil)),
		noProbe:        os.Getenv(helperProbe) != "",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := Open(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer tr.Close()
	c := tr.Conn(0, 0)
	stall := func() int {
		fmt.Println("ready")
		time.Sleep(time.Minute) // until killed
		return 1
	}
	switch mode {
	case "idle":
		return stall()
	case "close":
		// An orderly end: close the transport when rank 0 says so (closes
		// stdin), then exit.
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		if err := tr.Close(); err != nil {
			return fail(err)
		}
		return 0
	case "recv-stall":
		// Take part of a large message, then stop.
		r := recvJob(c, hdr(0, 0, 0, 1), make([]byte, helperSize))
		for r.Recv.Progress < 2*testRing {
			if _, err := c.TryRecv(r.Recv); err != nil {
				return fail(err)
			}
		}
		return stall()
	case "send-stall":
		// Fill the ring with part of a large message, then stop.
		s := sendJob(c, hdr(1, 0, 0, 1), pattern(1, helperSize))
		for {
			before := s.Send.Progress
			if _, err := c.TrySend(s.Send); err != nil {
				return fail(err)
			}
			if before > 0 && s.Send.Progress == before {
				break
			}
		}
		return stall()
	case "mapped-send-stall":
		// Send a message from a shareable buffer whole, then start a large
		// one from it and stop: rank 0 has the buffer mapped.
		buf, err := transport.AllocShared(helperSize, pageSize)
		if err != nil {
			return fail(err)
		}
		copy(buf, pattern(4, helperSize))
		if err := drive(tr, []job{sendJob(c, hdr(1, 0, 0, 1), buf[:1<<20])}, 10*time.Second); err != nil {
			return fail(err)
		}
		s := sendJob(c, hdr(1, 0, 1, 1), buf)
		if _, err := c.TrySend(s.Send); err != nil {
			return fail(err)
		}
		return stall()
	case "mapped-recv-stall":
		// Take part of a large message from rank 0's mapped buffer, then stop.
		r := recvJob(c, hdr(0, 0, 0, 1), make([]byte, helperSize))
		for r.Recv.Progress < hdrSize+1 {
			if _, err := c.TryRecv(r.Recv); err != nil {
				return fail(err)
			}
		}
		fmt.Printf("mapped=%d\n", tr.conns[0].rmaps.maps)
		return stall()
	case "bench":
		// Rank 1 of benchExchangeProcs.
		var s transport.SendOp
		var r transport.RecvOp
		out, in := pattern(2, size), make([]byte, size)
		if os.Getenv(helperMap) != "" {
			shared, err := transport.AllocShared(size, pageSize)
			if err != nil {
				return fail(err)
			}
			copy(shared, out)
			out = shared
		}
		for i := range iters {
			s.Reset(hdr(1, 0, 0, uint64(i)), out)
			r.Reset(hdr(0, 0, 0, uint64(i)), in, false)
			if _, err := progress(tr, c, &s, &r); err != nil {
				return fail(err)
			}
		}
		fmt.Println("done")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "llbench":
		// Rank 1 of benchLLExchangeProcs.
		out, in := pattern(2, size), make([]byte, size)
		e := transport.FirstEpoch
		for range iters {
			if err := tr.Store(0, e, testTag, out); err != nil {
				return fail(err)
			}
			var st transport.SlotLoad
			if _, err := loadLL(tr, 0, e, in, &st, 10*time.Second); err != nil {
				return fail(err)
			}
			e = transport.NextEpoch(e)
		}
		fmt.Println("done")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "pong":
		// Rank 1 of BenchmarkPingPongProcs.
		var s transport.SendOp
		var r transport.RecvOp
		buf := make([]byte, size)
		for i := range iters {
			r.Reset(hdr(0, 0, 0, uint64(i)), buf, false)
			if err := spinOp(c, nil, &r); err != nil {
				return fail(err)
			}
			s.Reset(hdr(1, 0, 0, uint64(i)), buf)
			if err := spinOp(c, &s, nil); err != nil {
				return fail(err)
			}
		}
		fmt.Println("done")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "echo":
		for k, size := range echoSizes {
			buf := make([]byte, size)
			r := recvJob(c, hdr(0, 0, k, 1), buf)
			if err := drive(tr, []job{r}, 10*time.Second); err != nil {
				return fail(err)
			}
			s := sendJob(c, hdr(1, 0, k, 1), buf)
			if err := drive(tr, []job{s}, 10*time.Second); err != nil {
				return fail(err)
			}
		}
		fmt.Printf("cmaoff=%v\n", tr.cmaOff.Load())
		fmt.Printf("mapoff=%v\n", tr.mapOff.Load())
		fmt.Printf("cmarecv=%d\n", tr.conns[0].rcmas)
		fmt.Println("done")
		// Rank 0 may still be reading the last echo from this process's
		// memory; exit when it says so by closing stdin.
		io.Copy(io.Discard, os.Stdin)
		return 0
	}
	return fail(fmt.Errorf("unknown helper mode %q", mode))
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

// startHelper starts a helper process in mode for group. userns runs it in a
// new user namespace, where it may not read this process's memory.
func startHelper(t testing.TB, mode, group, dir string, zcopy int, noProbe, userns bool, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"="+mode, helperGroup+"="+group, helperDir+"="+dir, helperZCopy+"="+strconv.Itoa(zcopy))
	if noProbe {
		cmd.Env = append(cmd.Env, helperProbe+"=1")
	}
	cmd.Env = append(cmd.Env, env...)
	if userns {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}},
		}
	}
	cmd.Stderr = transporttest.LogWriter(t)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, lines: make(chan string, 16), stdin: stdin}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

// expect waits for the helper to print want and returns the lines before it.
func (h *helper) expect(t testing.TB, want string) []string {
	t.Helper()
	var seen []string
	timeout := time.After(15 * time.Second)
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				t.Fatalf("helper exited before %q; it said %q", want, seen)
			}
			if l == want {
				return seen
			}
			seen = append(seen, l)
		case <-timeout:
			t.Fatalf("helper did not say %q within 15s; it said %q", want, seen)
		}
	}
}

// kill kills the helper with SIGKILL and reaps it.
func (h *helper) kill(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	h.cmd.Wait()
}

// killExpectLost kills the helper (rank 1) while an op of this rank waits on
// it, and checks that the op's error, sent on errc, is ErrPeerLost naming
// rank 1 and comes within a second of the death.
func (h *helper) killExpectLost(t *testing.T, errc <-chan error) {
	t.Helper()
	killedAt := time.Now()
	h.kill(t)
	var err error
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second):
		t.Fatal("no error within 5s of the peer's death")
	}
	elapsed := time.Since(killedAt)
	var fe *fault.Error
	if !errors.Is(err, fault.ErrPeerLost) || !errors.As(err, &fe) || fe.Rank != 1 {
		t.Fatalf("got %v, want ErrPeerLost naming rank 1", err)
	}
	if elapsed > time.Second {
		t.Fatalf("noticed the death after %v", elapsed)
	}
	t.Logf("noticed after %v: %v", elapsed, err)
}

// openRank0 opens this process's side of a group with a helper.
func openRank0(t testing.TB, group, dir string, zcopy int, mutate ...func(*Config)) *Transport {
	t.Helper()
	cfg := testConfig(t, group, 0, 2, 1, zcopy)
	cfg.Dir = dir
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tr, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open rank 0: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// TestKilledPeer kills a helper rank with SIGKILL in the middle of a transfer
// and checks that this rank fails with ErrPeerLost naming it within a bounded
// time, and that no segment file is left.
func TestKilledPeer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  string
		zcopy int
		op    func(c transport.Conn) job
	}{
		{"receiver killed mid-message", "recv-stall", ringOnly, func(c transport.Conn) job {
			return sendJob(c, hdr(0, 0, 0, 1), pattern(2, helperSize))
		}},
		{"sender killed mid-message", "send-stall", ringOnly, func(c transport.Conn) job {
			return recvJob(c, hdr(1, 0, 0, 1), make([]byte, helperSize))
		}},
		{"receiver killed before acknowledging CMA", "idle", cmaAll, func(c transport.Conn) job {
			return sendJob(c, hdr(0, 0, 0, 1), pattern(3, 1<<20))
		}},
		{"sender killed before sending", "idle", ringOnly, func(c transport.Conn) job {
			return recvJob(c, hdr(1, 0, 0, 1), make([]byte, 8))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := testGroup(t)
			h := startHelper(t, tc.mode, group, DefaultDir, tc.zcopy, false, false)
			tr := openRank0(t, group, DefaultDir, tc.zcopy)
			j := tc.op(tr.Conn(1, 0))
			errc := make(chan error, 1)
			go func() { errc <- drive(tr, []job{j}, 10*time.Second) }()
			h.expect(t, "ready")
			time.Sleep(20 * time.Millisecond) // let this rank stall too
			if files := groupFiles(t, DefaultDir, group); len(files) > 0 {
				t.Fatalf("segment files linked while both ranks run: %v", files)
			}
			h.killExpectLost(t, errc)
			tr.Close()
			checkNoFiles(t, DefaultDir, group)
		})
	}
}

// TestPeerExitLogLevel: a peer that closes its transport and exits is a
// Debug event in this rank's log, one killed without closing is a warning.
func TestPeerExitLogLevel(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		end        func(t *testing.T, h *helper)
		want       string // the log line
		notWant    string
	}{
		{"orderly close", "close", func(t *testing.T, h *helper) { h.stdin.Close(); h.cmd.Wait() },
			`level=DEBUG msg="shm: peer left after closing its transport"`, "level=WARN"},
		{"killed", "idle", func(t *testing.T, h *helper) { h.kill(t) },
			`level=WARN msg="shm: peer exited without closing its transport"`, "peer left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := testGroup(t)
			var log lockedBuffer
			h := startHelper(t, tc.mode, group, DefaultDir, ringOnly, false, false)
			tr := openRank0(t, group, DefaultDir, ringOnly, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			h.expect(t, "ready")
			tc.end(t, h)
			if !transporttest.WaitFor(5*time.Second, func() bool { tr.checkPeers(); return tr.dead[1].Load() }) {
				t.Fatal("the peer's exit went unnoticed")
			}
			got := log.String()
			if !strings.Contains(got, tc.want) || strings.Contains(got, tc.notWant) {
				t.Errorf("log:\n%s\nwant a line with %s and none with %s", got, tc.want, tc.notWant)
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer for a logger used from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCMAFallback runs rank 1 in a user namespace, where the kernel refuses
// it process_vm_readv on rank 0 (EPERM), and checks that large messages
// still arrive: through the ring from the start when the probe at Open
// catches it, or after the first descriptor is refused when it does not.
// From a shareable buffer, rank 1 is refused pidfd_getfd first (mapping
// off), then process_vm_readv. Rank 0 may read rank 1's memory, so the
// echoes come back by CMA.
func TestCMAFallback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noProbe bool
		shared  bool   // rank 0 sends from a shareable buffer
		cmaOff  string // what rank 1 reports
		mapOff  string
	}{
		{"refused at open", false, false, "false", "false"},
		{"refused at first use", true, false, "true", "false"},
		{"refused at open/shared", false, true, "false", "false"},
		// pidfd_getfd fails first, then CMA.
		{"refused at first use/shared", true, true, "true", "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := testGroup(t)
			h := startHelper(t, "echo", group, DefaultDir, cmaAll, tc.noProbe, true)
			tr := openRank0(t, group, DefaultDir, cmaAll)
			c := tr.Conn(1, 0)
			for k, size := range echoSizes {
				msg := pattern(uint64(k+20), size)
				if tc.shared {
					msg = sharedBuf(t, size, uint64(k+20))
				}
				back := make([]byte, size)
				jobs := []job{sendJob(c, hdr(0, 0, k, 1), msg), recvJob(c, hdr(1, 0, k, 1), back)}
				if err := drive(tr, jobs, 10*time.Second); err != nil {
					t.Fatalf("message %d (%d bytes): %v", k, size, err)
				}
				if !bytes.Equal(back, msg) {
					t.Fatalf("message %d (%d bytes) came back corrupted", k, size)
				}
			}
			report := h.expect(t, "done")
			h.stdin.Close()
			if err := h.cmd.Wait(); err != nil {
				t.Fatalf("helper: %v (%q)", err, report)
			}
			want := []string{"cmaoff=" + tc.cmaOff, "mapoff=" + tc.mapOff, "cmarecv=0"}
			if strings.Join(report, ",") != strings.Join(want, ",") {
				t.Errorf("rank 1 reports %q, want %q", report, want)
			}
			if ok := tr.conns[1].tx.cmaOK.Load(); ok != 0 {
				t.Errorf("rank 1 still takes CMA descriptors from rank 0 (cmaOK %d)", ok)
			}
			if !tr.ZCopy(1) {
				t.Error("rank 0 does not take CMA descriptors from rank 1")
			}
			if got := tr.conns[1].rcmas; got != uint64(len(echoSizes)) {
				t.Errorf("rank 0 received %d echoes by CMA, want %d", got, len(echoSizes))
			}
		})
	}
}

// TestStaleSegments leaves a segment file behind by killing a helper while it
// waits in Open, and checks each cleanup path: the rank reopening the same
// name replaces it, an Open of another epoch sweeps it, and Sweep removes it
// but not a live rank's file.
func TestStaleSegments(t *testing.T) {
	// leave kills a helper of group in dir once its segment exists and
	// returns the file left behind.
	leave := func(t *testing.T, group, dir string) string {
		h := startHelper(t, "idle", group, dir, ringOnly, false, false)
		path := waitPublished(t, dir, group)
		h.kill(t)
		if files := groupFiles(t, dir, group); len(files) != 1 || files[0] != path {
			t.Fatalf("files after the kill: %v, want the helper's segment %s", files, path)
		}
		return path
	}
	t.Run("same name replaced", func(t *testing.T) {
		group := testGroup(t)
		leave(t, group, DefaultDir)
		ts := newCluster(t, 2, 1, ringOnly, func(c *Config) { c.Group = group })
		exchangeOnce(t, ts)
	})
	t.Run("other epoch swept", func(t *testing.T) {
		group := testGroup(t)
		stale := leave(t, group, DefaultDir)
		ts := newCluster(t, 2, 1, ringOnly, func(c *Config) { c.Group = group; c.Epoch = testEpoch + 1 })
		if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stale segment %s of epoch %d still there after Open of epoch %d: %v", stale, testEpoch, testEpoch+1, err)
		}
		exchangeOnce(t, ts)
	})
	t.Run("Sweep", func(t *testing.T) {
		dir := t.TempDir()
		group := testGroup(t)
		stale := leave(t, group, dir)
		// A live rank waiting in Open for its peer: its file must stay.
		live := testGroup(t)
		cfg := testConfig(t, live, 0, 2, 1, ringOnly)
		cfg.Dir = dir
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			tr, err := Open(ctx, cfg)
			if tr != nil {
				tr.Close()
			}
			errc <- err
		}()
		waitPublished(t, dir, live)
		removed, err := Sweep(dir)
		if err != nil || len(removed) != 1 || removed[0] != filepath.Base(stale) {
			t.Errorf("Sweep: %v %v, want [%s]", removed, err, filepath.Base(stale))
		}
		if files := groupFiles(t, dir, live); len(files) != 1 {
			t.Errorf("Sweep removed a live rank's segment: %v", files)
		}
		cancel()
		if err := <-errc; !errors.Is(err, fault.ErrAborted) {
			t.Errorf("cancelled Open: %v, want ErrAborted", err)
		}
		checkNoFiles(t, dir, live)
		checkNoFiles(t, dir, group)
	})
}

// exchangeOnce checks that ranks 0 and 1 of ts exchange a message.
func exchangeOnce(t *testing.T, ts []*Transport) {
	t.Helper()
	a, b := pattern(30, 5000), pattern(31, 5000)
	ra, rb := make([]byte, len(b)), make([]byte, len(a))
	jobs := [][]job{
		{sendJob(ts[0].Conn(1, 0), hdr(0, 0, 0, 1), a), recvJob(ts[0].Conn(1, 0), hdr(1, 0, 0, 1), ra)},
		{sendJob(ts[1].Conn(0, 0), hdr(1, 0, 0, 1), b), recvJob(ts[1].Conn(0, 0), hdr(0, 0, 0, 1), rb)},
	}
	if err := firstErr(driveAll(ts, jobs, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ra, b) || !bytes.Equal(rb, a) {
		t.Fatal("exchange corrupted")
	}
}
