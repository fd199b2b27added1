// Package launch starts the ranks of a job as local processes, as `a2ad run`,
// `a2ad bench` and `a2ad demo` do: like mpirun or torchrun for one host.
package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/internal/cpus"
)

// Spec describes the ranks to start.
type Spec struct {
	N          int    // ranks started here
	World      int    // ranks in the job (0: N); more than N when other hosts start the rest
	RankOffset int    // rank of the first process started here
	NATSURL    string // control plane every rank joins
	Group      string
	Secret     string
	Env        []string // extra environment for every rank
	Prog       string
	Args       []string
	// Prefix puts "[rank k] " before every output line. Without it only rank
	// RankOffset's stdout is shown, unprefixed (benchmarks print from one rank);
	// stderr is always prefixed.
	Prefix bool
	Stdout io.Writer
	Stderr io.Writer
	// Grace is how long the other ranks get after SIGTERM before SIGKILL when
	// one rank fails (default 2s).
	Grace time.Duration
	// BindVia, when set, binds each rank to one CPU as mpirun does by
	// default: rank i of N runs on the i-th CPU this process may use, provided
	// N does not exceed them. Oversubscribed ranks are left to the scheduler:
	// bound to cores in turn, 4 ranks on 2 cores ran 8 B AllToAll steadily
	// (4.8 us against 4.9-7.0 us) but 1 MiB slower (1160-1590 us against
	// 1000-1290 us; again 800-1130 against 700-830 later), and MoE steps are
	// large. Unbound, the ranks spread themselves evenly over the cores
	// (shm.Transport.Rebalance), which the kernel alone did not.
	// It names an executable that runs ExecPinned on `BindVia pin CPU PROG ARGS`
	// (a2ad itself), so the affinity is set before PROG starts any thread.
	BindVia string
	// Expendable is how many ranks may die of a signal without ending the
	// job: their survivors are meant to shrink the group and carry on (the
	// MoE demo's --kill-rank). Such a death is reported on Stderr, and Run
	// returns nil when every other rank succeeds. A rank that exits with an
	// error still ends the job.
	Expendable int
}

// ExecPinned binds the calling process to cpu and replaces it with prog. It is
// the trampoline behind Spec.BindVia: affinity set before exec is inherited by
// every thread the program will start.
func ExecPinned(cpu int, prog string, args []string) error {
	runtime.LockOSThread() // the affinity and the exec must happen on one thread
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("bind to cpu %d: %w", cpu, err)
	}
	path, err := exec.LookPath(prog)
	if err != nil {
		return err
	}
	return syscall.Exec(path, append([]string{prog}, args...), os.Environ())
}

// RankError says which rank failed first and how; Others lists the ranks that
// failed after it (typically with ErrPeerLost).
type RankError struct {
	Rank   int
	State  string // "exit status 3", "signal: killed"
	Others []int
}

func (e *RankError) Error() string {
	s := fmt.Sprintf("rank %d failed: %s", e.Rank, e.State)
	if len(e.Others) > 0 {
		s += fmt.Sprintf(" (then ranks %v stopped)", e.Others)
	}
	return s
}

// ErrInterrupted is matched (errors.Is) by Run's error when its context
// ended the job before any rank failed: Run stopped the ranks, so how they
// exited says nothing about them. The error wraps the context's cause too.
var ErrInterrupted = errors.New("interrupted")

type exit struct {
	rank int
	err  error
}

// Run starts the ranks and waits for all of them. If one fails (non-zero exit,
// killed by a signal), the rest are terminated and Run returns a *RankError
// naming the first failure. Cancelling ctx terminates all ranks, and Run
// returns ErrInterrupted unless a rank had failed before.
func Run(ctx context.Context, spec Spec) error {
	if spec.N < 1 {
		return fmt.Errorf("launch: need at least one rank, got %d", spec.N)
	}
	world := spec.World
	if world == 0 {
		world = spec.N
	}
	if spec.RankOffset < 0 || spec.RankOffset+spec.N > world {
		return fmt.Errorf("launch: ranks %d..%d outside world size %d", spec.RankOffset, spec.RankOffset+spec.N-1, world)
	}
	grace := spec.Grace
	if grace == 0 {
		grace = 2 * time.Second
	}
	stdout, stderr := spec.Stdout, spec.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	var outMu sync.Mutex
	var bindTo []int
	if spec.BindVia != "" {
		if c := cpus.Allowed(); spec.N <= len(c) {
			bindTo = c
		}
	}
	cmds := make([]*exec.Cmd, spec.N)
	exits := make(chan exit, spec.N)
	for i := range spec.N {
		rank := spec.RankOffset + i
		cmd := exec.Command(spec.Prog, spec.Args...)
		if bindTo != nil {
			cmd = exec.Command(spec.BindVia, append([]string{"pin", strconv.Itoa(bindTo[i]), spec.Prog}, spec.Args...)...)
		}
		cmd.Env = append(os.Environ(),
			"A2A_NATS_URL="+spec.NATSURL,
			"A2A_GROUP="+spec.Group,
			"A2A_SECRET="+spec.Secret,
			fmt.Sprintf("A2A_RANK=%d", rank),
			fmt.Sprintf("A2A_WORLD_SIZE=%d", world),
			fmt.Sprintf("A2A_LOCAL_RANK=%d", i),
			fmt.Sprintf("A2A_LOCAL_SIZE=%d", spec.N),
		)
		cmd.Env = append(cmd.Env, spec.Env...)
		// Each rank in its own process group so its children die with it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		prefix := fmt.Sprintf("[rank %d] ", rank)
		showOut := spec.Prefix || i == 0
		outPrefix := prefix
		if !spec.Prefix {
			outPrefix = ""
		}
		so, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		se, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			killAll(cmds, syscall.SIGKILL)
			return fmt.Errorf("launch: start rank %d: %w", rank, err)
		}
		cmds[i] = cmd
		var drained sync.WaitGroup
		drained.Add(2)
		go copyLines(&drained, &outMu, so, stdout, outPrefix, showOut)
		go copyLines(&drained, &outMu, se, stderr, prefix, true)
		go func() {
			drained.Wait() // exec.Cmd: Wait only after the pipes are read to EOF
			exits <- exit{rank: rank, err: cmd.Wait()}
		}()
	}
	// When a rank fails, the others usually fail right after it (they lose
	// their peer), sometimes before the launcher even reaps the first one.
	// So failures are collected for a short settle window before the rest
	// are terminated, and the root cause is the rank killed by a signal if
	// there is one (a crash or kill -9 outside our control), else the earliest.
	const settle = 200 * time.Millisecond
	var failures []exit
	ours := -1 // failures[ours:] came after we terminated the ranks ourselves
	terminated := false
	var settleTimer, killTimer <-chan time.Time
	var interrupted error // ctx's cause, when ctx ended the job
	expended := 0         // ranks lost that Expendable allowed
	// terminate stops the ranks still running, once: SIGTERM now, SIGKILL
	// after the grace period.
	terminate := func() {
		if terminated {
			return
		}
		terminated, ours = true, len(failures)
		killAll(cmds, syscall.SIGTERM)
		killTimer = time.After(grace)
	}
	for remaining := spec.N; remaining > 0; {
		select {
		case ex := <-exits:
			remaining--
			if ex.err == nil {
				continue
			}
			if !terminated && expended < spec.Expendable && signaled(ex.err) {
				expended++
				outMu.Lock()
				fmt.Fprintf(stderr, "launch: rank %d %s; the others carry on without it\n", ex.rank, describe(ex.err))
				outMu.Unlock()
				continue
			}
			failures = append(failures, ex)
			if !terminated && settleTimer == nil {
				settleTimer = time.After(settle)
			}
		case <-settleTimer:
			settleTimer = nil
			terminate()
		case <-killTimer:
			killAll(cmds, syscall.SIGKILL)
		case <-ctx.Done():
			if len(failures) == 0 {
				interrupted = fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
			}
			terminate()
			ctx = context.Background() // a nil Done channel: never again
		}
	}
	if interrupted != nil {
		return interrupted
	}
	if len(failures) == 0 {
		return nil
	}
	if ours < 0 {
		ours = len(failures)
	}
	root := 0
	for i, f := range failures[:ours] {
		if signaled(f.err) {
			root = i
			break
		}
	}
	re := &RankError{Rank: failures[root].rank, State: describe(failures[root].err)}
	for i, f := range failures {
		if i != root {
			re.Others = append(re.Others, f.rank)
		}
	}
	sort.Ints(re.Others)
	return re
}

// waitStatus is the wait status of a rank whose exec.Cmd.Wait returned err;
// ok is false when err does not come from the rank's exit.
func waitStatus(err error) (ws syscall.WaitStatus, ok bool) {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ws, ok = ee.Sys().(syscall.WaitStatus)
	}
	return ws, ok
}

// signaled reports whether a rank died of a signal.
func signaled(err error) bool {
	ws, ok := waitStatus(err)
	return ok && ws.Signaled()
}

// describe says how a rank failed, for RankError.State.
func describe(err error) string {
	ws, ok := waitStatus(err)
	if !ok {
		return err.Error()
	}
	if ws.Signaled() {
		return "killed by signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

func killAll(cmds []*exec.Cmd, sig syscall.Signal) {
	for _, c := range cmds {
		if c != nil && c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, sig) // ESRCH once it is gone: fine
		}
	}
}

func copyLines(wg *sync.WaitGroup, mu *sync.Mutex, r io.Reader, w io.Writer, prefix string, show bool) {
	defer wg.Done()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if !show {
			continue
		}
		mu.Lock()
		io.WriteString(w, prefix+strings.TrimRight(sc.Text(), "\r")+"\n")
		mu.Unlock()
	}
	io.Copy(io.Discard, r)
}
