package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string // a2ad and moe, built once for the tests that run them
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds a2ad and the MoE demo (what deploy/Dockerfile puts in the
// image) and returns the directory holding them.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "a2a-deploy-test"); buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "../cmd/a2ad", "../examples/moe").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// baseEnv is the environment of the processes the tests start: this one's
// without A2A_* variables, PATH with the built binaries first, and a home of
// their own (a2ad serve writes its credentials file there by default: never
// in the real one).
func baseEnv(t *testing.T, extraPath ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "A2A_") && name != "PATH" && name != "HOME" && name != "XDG_CONFIG_HOME" {
			env = append(env, kv)
		}
	}
	home := t.TempDir()
	return append(env, "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"PATH="+strings.Join(append(extraPath, binaries(t), os.Getenv("PATH")), string(filepath.ListSeparator)))
}

// proc is a process started by a test, in its own process group.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	err            error
}

// start starts cmd; the test's cleanup ends its whole process group
// (SIGTERM, then SIGKILL) if it still runs.
func start(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// wait waits for p to exit and returns its error, failing the test at the
// context's deadline.
func (p *proc) wait(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		t.Fatalf("%s still runs at the deadline\nstdout:\n%s\nstderr:\n%s", p.name, p.stdout.String(), p.stderr.String())
		return nil
	}
}

// waitOutput waits until p's standard output holds s.
func (p *proc) waitOutput(t *testing.T, ctx context.Context, s string) {
	t.Helper()
	for !strings.Contains(p.stdout.String(), s) {
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before printing %q\nstdout:\n%s\nstderr:\n%s", p.name, p.err, s, p.stdout.String(), p.stderr.String())
		case <-ctx.Done():
			t.Fatalf("%s did not print %q\nstdout:\n%s\nstderr:\n%s", p.name, s, p.stdout.String(), p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// syncBuffer is a bytes.Buffer written by a process and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freePort returns a TCP port free on the loopback interface just now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
