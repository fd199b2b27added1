// Package launch starts the ranks of a job as local processes, as `a2ad run`,
// `a2ad bench` and `a2ad demo` do: like mpirun or torchrun for one host.
package launch

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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

// NewGroup is a fresh group (job) name for Spec.Group: prefix, a dash and
// 12 random hex digits, so that jobs sharing a control plane never meet.
func NewGroup(prefix string) string { return prefix + "-" + randomHex(6) }

// NewSecret is a fresh job secret for Spec.Secret: 128 random bits in hex.
func NewSecret() string { return randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
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

// exit is a reaped rank and what exec.Cmd.Wait said about it.
type exit struct {
	rank int
	err  error
}

// Run starts the ranks and waits for all of them. If one fails (non-zero exit,
// killed by a signal), the rest are terminated and Run returns a *RankError
// naming the first failure. Cancelling ctx terminates all ranks, and Run
// returns ErrInterrupted unless a rank had failed before.
func Run(ctx context.Context, spec Spec) error {
	j, err := newJob(spec)
	if err != nil {
		return err
	}
	if err := j.start(); err != nil {
		return err
	}
	return j.watch(ctx)
}

// job is one Run: the spec with its defaults filled in and the ranks it
// started.
type job struct {
	spec           Spec
	world          int
	grace          time.Duration
	stdout, stderr io.Writer
	outMu          sync.Mutex // one line at a time on stdout and stderr
	bindTo         []int      // CPU of each rank; nil: unbound
	cmds           []*exec.Cmd
	exits          chan exit // every rank's, once reaped
}

// newJob checks spec and fills in its defaults.
func newJob(spec Spec) (*job, error) {
	if spec.N < 1 {
		return nil, fmt.Errorf("launch: need at least one rank, got %d", spec.N)
	}
	j := &job{spec: spec, world: cmp.Or(spec.World, spec.N), grace: cmp.Or(spec.Grace, 2*time.Second),
		stdout: spec.Stdout, stderr: spec.Stderr, cmds: make([]*exec.Cmd, spec.N), exits: make(chan exit, spec.N)}
	if spec.RankOffset < 0 || spec.RankOffset+spec.N > j.world {
		return nil, fmt.Errorf("launch: ranks %d..%d outside world size %d", spec.RankOffset, spec.RankOffset+spec.N-1, j.world)
	}
	if j.stdout == nil {
		j.stdout = os.Stdout
	}
	if j.stderr == nil {
		j.stderr = os.Stderr
	}
	if spec.BindVia != "" {
		if c := cpus.Allowed(); spec.N <= len(c) {
			j.bindTo = c
		}
	}
	return j, nil
}

// start starts every rank. When one fails to start, those started before
// it are killed.
func (j *job) start() error {
	for i := range j.spec.N {
		if err := j.startRank(i); err != nil {
			return err
		}
	}
	return nil
}

// startRank starts the i-th rank started here, copies its output lines
// and reaps it into j.exits.
func (j *job) startRank(i int) error {
	rank := j.spec.RankOffset + i
	cmd := j.command(i)
	prefix := fmt.Sprintf("[rank %d] ", rank)
	showOut := j.spec.Prefix || i == 0
	outPrefix := prefix
	if !j.spec.Prefix {
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
		killAll(j.cmds, syscall.SIGKILL)
		return fmt.Errorf("launch: start rank %d: %w", rank, err)
	}
	j.cmds[i] = cmd
	var drained sync.WaitGroup
	drained.Add(2)
	go copyLines(&drained, &j.outMu, so, j.stdout, outPrefix, showOut)
	go copyLines(&drained, &j.outMu, se, j.stderr, prefix, true)
	go func() {
		drained.Wait() // exec.Cmd: Wait only after the pipes are read to EOF
		j.exits <- exit{rank: rank, err: cmd.Wait()}
	}()
	return nil
}

// command is the i-th rank's command: the program, through the BindVia
// trampoline when bound, with the A2A_* environment that places it in the
// job.
func (j *job) command(i int) *exec.Cmd {
	spec := j.spec
	cmd := exec.Command(spec.Prog, spec.Args...)
	if j.bindTo != nil {
		cmd = exec.Command(spec.BindVia, append([]string{"pin", strconv.Itoa(j.bindTo[i]), spec.Prog}, spec.Args...)...)
	}
	cmd.Env = append(os.Environ(),
		"A2A_NATS_URL="+spec.NATSURL,
		"A2A_GROUP="+spec.Group,
		"A2A_SECRET="+spec.Secret,
		fmt.Sprintf("A2A_RANK=%d", spec.RankOffset+i),
		fmt.Sprintf("A2A_WORLD_SIZE=%d", j.world),
		fmt.Sprintf("A2A_LOCAL_RANK=%d", i),
		fmt.Sprintf("A2A_LOCAL_SIZE=%d", spec.N),
	)
	cmd.Env = append(cmd.Env, spec.Env...)
	// Each rank in its own process group so its children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// settle is how long failures are collected before the other ranks are
// terminated.
//
// When a rank fails, the others usually fail right after it (they lose
// their peer), sometimes before the launcher even reaps the first one.
// So failures are collected for a short settle window before the rest
// are terminated, and the root cause is the rank killed by a signal if
// there is one (a crash or kill -9 outside our control), else the earliest.
const settle = 200 * time.Millisecond

// watcher is what Run learns while it reaps the ranks.
type watcher struct {
	j           *job
	failures    []exit
	ours        int // failures[ours:] came after we terminated the ranks ourselves; -1 until then
	terminated  bool
	settleTimer <-chan time.Time
	killTimer   <-chan time.Time
	interrupted error // ctx's cause, when ctx ended the job
	expended    int   // ranks lost that Expendable allowed
}

// watch reaps every rank, terminating the rest when one fails or ctx ends,
// and says how the job ended.
func (j *job) watch(ctx context.Context) error {
	w := &watcher{j: j, ours: -1}
	for remaining := j.spec.N; remaining > 0; {
		select {
		case ex := <-j.exits:
			remaining--
			w.exited(ex)
		case <-w.settleTimer:
			w.settleTimer = nil
			w.terminate()
		case <-w.killTimer:
			killAll(j.cmds, syscall.SIGKILL)
		case <-ctx.Done():
			if len(w.failures) == 0 {
				w.interrupted = fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
			}
			w.terminate()
			ctx = context.Background() // a nil Done channel: never again
		}
	}
	return w.result()
}

// exited takes in a rank's exit: a success, a death Expendable allows, or a
// failure that ends the job after the settle window.
func (w *watcher) exited(ex exit) {
	if ex.err == nil {
		return
	}
	if !w.terminated && w.expended < w.j.spec.Expendable && signaled(ex.err) {
		w.expended++
		w.j.outMu.Lock()
		fmt.Fprintf(w.j.stderr, "launch: rank %d %s; the others carry on without it\n", ex.rank, describe(ex.err))
		w.j.outMu.Unlock()
		return
	}
	w.failures = append(w.failures, ex)
	if !w.terminated && w.settleTimer == nil {
		w.settleTimer = time.After(settle)
	}
}

// terminate stops the ranks still running, once: SIGTERM now, SIGKILL
// after the grace period.
func (w *watcher) terminate() {
	if w.terminated {
		return
	}
	w.terminated, w.ours = true, len(w.failures)
	killAll(w.j.cmds, syscall.SIGTERM)
	w.killTimer = time.After(w.j.grace)
}

// result is Run's error once every rank is reaped.
func (w *watcher) result() error {
	if w.interrupted != nil {
		return w.interrupted
	}
	if len(w.failures) == 0 {
		return nil
	}
	ours := w.ours
	if ours < 0 {
		ours = len(w.failures)
	}
	return rootCause(w.failures, ours)
}

// rootCause names the failure that ended the job: the first rank killed by
// a signal among those that failed before we terminated the ranks
// (failures[:ours]), else the earliest. The others are listed after it.
func rootCause(failures []exit, ours int) *RankError {
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
