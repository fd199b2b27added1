package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/internal/doctest"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// The pages whose commands the tests run as they stand, from the repository
// root: their blocks marked <!-- doc-test: run by cmd/a2acheck TestXxx -->.
const (
	launchersDoc = "docs/LAUNCHERS.md"
	multihostDoc = "docs/MULTIHOST.md"
)

// docLaunchers are the commands of docs/LAUNCHERS.md that start ranks; every
// one must appear on the page.
var docLaunchers = []string{"mpirun", "mpiexec", "srun", "torchrun"}

// TestLaunchersDoc runs docs/LAUNCHERS.md as a new user would: the a2ad serve
// line, then every launcher line after the exports that precede it, each to 4
// verified ranks reporting the launcher and group the page's table says.
// As root the page's hosts are network namespaces (testNet) and the lines
// run as written; otherwise what one machine cannot do as written is
// replaced (docSession).
func TestLaunchersDoc(t *testing.T) {
	blocks := docBlocks(t, launchersDoc, "TestLaunchersDoc")
	s := newDocSession(t, hostsNet(t))
	serveAt := slices.IndexFunc(blocks, func(b doctest.Block) bool { return slices.ContainsFunc(b.Commands(), isServe) })
	if serveAt < 0 {
		t.Fatalf("%s: no a2ad serve line", launchersDoc)
	}
	s.startServe(t, blocks[serveAt].Commands())

	// The lines after the serve's block: exports, which every later launcher
	// line runs after, and the launcher lines.
	var setup []string
	seen := map[string]int{}
	for _, block := range blocks[serveAt+1:] {
		for _, line := range block.Commands() {
			name := strings.Fields(line)[0]
			switch {
			case name == "go":
				// go build of a2acheck: TestMain built it from this checkout.
			case isJobNew(line):
				s.jobNew(t, setup, line)
			case slices.Contains(docLaunchers, name):
				seen[name]++
				setup := slices.Clone(setup)
				t.Run(fmt.Sprintf("%s#%d", name, seen[name]), func(t *testing.T) {
					s.runLauncher(t, block.ID(), setup, line)
				})
			default:
				setup = append(setup, line)
			}
		}
	}
	for _, name := range docLaunchers {
		if seen[name] == 0 {
			t.Errorf("%s shows no %s line", launchersDoc, name)
		}
	}
}

// TestMultihostDoc runs docs/MULTIHOST.md's control plane: its a2ad serve
// line on node0, then 2 ranks on each host configured by its exports and the
// A2A_* variables its table names. As root the hosts are network namespaces
// (testNet) and the lines run as written.
func TestMultihostDoc(t *testing.T) {
	blocks := docBlocks(t, multihostDoc, "TestMultihostDoc")
	at := slices.IndexFunc(blocks, func(b doctest.Block) bool { return slices.ContainsFunc(b.Commands(), isServe) })
	if at < 0 {
		t.Fatalf("%s: no a2ad serve line", multihostDoc)
	}
	block := blocks[at].Commands()
	serve := slices.IndexFunc(block, isServe)
	s := newDocSession(t, hostsNet(t))
	s.startServe(t, block[:serve+1])
	// The job's file is minted once, then every host's ranks read it.
	perHostSetup := slices.DeleteFunc(slices.Clone(block[serve+1:]), func(line string) bool {
		if isJobNew(line) {
			s.jobNew(t, nil, line)
			return true
		}
		return false
	})
	group := fmt.Sprintf("multihost-%d", rand.Uint32())
	perHost := ranks / len(netHosts)
	outs, errs := make([][]byte, len(netHosts)), make([]error, len(netHosts))
	done := make(chan bool)
	for i, host := range netHosts {
		// A2A_LISTEN as the table says: this host's address (hostname -I).
		startRanks := fmt.Sprintf(`export A2A_GROUP=%s A2A_WORLD_SIZE=%d A2A_LISTEN=$(hostname -I | cut -d" " -f1):0
pids=()
for ((r = %d; r < %d; r++)); do A2A_RANK=$r ./prog & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit "$rc"`, group, ranks, i*perHost, (i+1)*perHost)
		go func() {
			outs[i], errs[i] = s.run(t, host, s.script(append(slices.Clone(perHostSetup), startRanks)), nil)
			done <- true
		}()
	}
	for range netHosts {
		<-done
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ranks on %s: %v\n%s", netHosts[i], err, outs[i])
		}
	}
	checkRanks(t, bytes.Join(outs, nil), want{launcher: "", group: regexp.MustCompile("^" + group + "$"), ranks: ranks,
		local: func(int) (int, int) { return -1, 0 }})
}

// hostsNet returns the pages' hosts as network namespaces, or nil (the hosts
// are this machine) when the test cannot make them.
func hostsNet(t *testing.T) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Log("not root: node0 and node1 are this machine, not network namespaces")
		return nil
	}
	return newTestNet(t)
}

// isServe reports whether a command starts a2ad serve.
func isServe(cmd string) bool { return strings.HasPrefix(cmd, "a2ad serve ") }

// isJobNew reports whether a command mints a job's credentials file.
func isJobNew(cmd string) bool { return strings.HasPrefix(cmd, "a2ad job new") }

// jobNew runs setup then line, an a2ad job new of the page, once on node0,
// as the operator mints a job's file before launching it: the lines after
// it are that job's.
func (s *docSession) jobNew(t *testing.T, setup []string, line string) {
	t.Helper()
	script := s.script(append(slices.Clone(setup), line))
	if out, err := s.run(t, netHosts[0], script, nil); err != nil {
		t.Fatalf("%s\n%v\n%s", script, err, out)
	}
}

// docBlocks returns the blocks of page (from the repository root) whose
// doc-test comment gives them to test.
func docBlocks(t *testing.T, page, test string) []doctest.Block {
	t.Helper()
	blocks, err := doctest.Parse("../..", page)
	if err != nil {
		t.Fatal(err)
	}
	blocks = slices.DeleteFunc(blocks, func(b doctest.Block) bool {
		return b.Mark.Kind != doctest.RunBy || b.Mark.Pkg != "cmd/a2acheck" || b.Mark.Test != test
	})
	if len(blocks) == 0 {
		t.Fatalf("%s: no block marked <!-- doc-test: run by cmd/a2acheck %s -->", page, test)
	}
	return blocks
}

// A docSession runs a page's commands as a user would run them on a
// cluster, with what the test cannot do as written replaced:
//   - the home directory is a temporary one, shared by the hosts (a2ad
//     serve's credentials file in its .config), and the commands run in a
//     directory holding the rank program as ./prog and ./a2acheck;
//   - mpirun and mpiexec are Debian's Open MPI and Hydra, run as root and
//     oversubscribed, with their daemons on the hosts' interface (set by
//     their environment variables, not on the command line); srun and
//     torchrun are the stand-ins of testdata/launchers.
//
// With a testNet the hosts node0 and node1 are its namespaces, where the
// commands run as written: ports are the namespaces' own, an ssh stand-in
// starts the launchers' daemons on node1. Without one they are this
// machine, and more is replaced: node0 and node1 are localhost, 0.0.0.0 is
// 127.0.0.1, the ports 4222 (NATS) and 9464 (a2ad serve's /metrics) free
// ones, so that tests running at once do not meet (a2ad serve's /metrics,
// on by default, gets a free port too), and hostname -I is 127.0.0.1 (the
// hostname stand-in).
type docSession struct {
	dir      string // where the commands run
	env      []string
	rewrites *strings.Replacer
	net      *testNet // nil: the hosts are this machine
}

func newDocSession(t *testing.T, net *testNet) *docSession {
	t.Helper()
	s := &docSession{dir: t.TempDir(), net: net}
	home, bin, standins := t.TempDir(), t.TempDir(), t.TempDir()
	for _, name := range []string{"prog", "a2acheck"} {
		if err := os.Symlink(checkBin, filepath.Join(s.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Scripts rather than links: Hydra looks for its proxy next to the
	// path it was started by.
	for name, launcher := range map[string][2]string{"mpirun": {"mpirun.openmpi", "openmpi-bin"}, "mpiexec": {"mpiexec.hydra", "mpich"}} {
		script := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", need(t, launcher[0], launcher[1]))
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	names := []string{"srun", "torchrun", "hostname"}
	if net != nil {
		names = names[:2] // a namespace's hostname -I is its own address
	}
	for _, name := range names {
		standin, err := filepath.Abs(filepath.Join("testdata", "launchers", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(standin, filepath.Join(standins, name)); err != nil {
			t.Fatal(err)
		}
	}
	path := []string{bin, standins, filepath.Dir(a2adBin)}
	iface, hydra := "lo", "fork"
	if net != nil {
		path, iface, hydra = append(path, net.sshDir), "eth0", "ssh"
	}
	s.env = append(cleanEnv(), "HOME="+home, "XDG_CONFIG_HOME=", // a2ad serve's file in ~/.config, as the pages say
		"PATH="+strings.Join(append(path, os.Getenv("PATH")), string(os.PathListSeparator)),
		"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1",
		"OMPI_MCA_btl=self,tcp", "OMPI_MCA_btl_tcp_if_include="+iface, "OMPI_MCA_oob_tcp_if_include="+iface,
		"HYDRA_LAUNCHER="+hydra, "HYDRA_IFACE="+iface)
	s.rewrites = strings.NewReplacer()
	if net == nil {
		s.rewrites = strings.NewReplacer("node0", "localhost", "node1", "localhost", "0.0.0.0", "127.0.0.1",
			"4222", strconv.Itoa(freePort(t)), "9464", strconv.Itoa(freePort(t)),
			"a2ad serve ", "a2ad serve --metrics 127.0.0.1:0 ")
	}
	return s
}

// argv returns the command line that runs a bash script on host.
func (s *docSession) argv(host, script string) []string {
	argv := []string{"bash", "-e", "-c", script}
	if s.net != nil {
		argv = s.net.argv(host, argv...)
	}
	return argv
}

// script is the commands as one bash script, rewritten for this machine.
func (s *docSession) script(cmds []string) string {
	return s.rewrites.Replace(strings.Join(cmds, "\n"))
}

// run runs a bash script on host in the session's directory and environment
// (plus env), and returns its output.
func (s *docSession) run(t *testing.T, host, script string, env []string) ([]byte, error) {
	t.Helper()
	argv := s.argv(host, script)
	cmd := command(t, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = s.dir, append(slices.Clone(s.env), env...)
	return cmd.CombinedOutput()
}

// startServe runs block up to its a2ad serve line on node0, where it keeps
// running until the test ends, and waits until a2ad says the control plane
// is ready: over TLS when the line listens beyond loopback (serve makes its
// own) or gives a certificate, in clear otherwise.
func (s *docSession) startServe(t *testing.T, block []string) {
	t.Helper()
	at := slices.IndexFunc(block, isServe)
	line := block[at]
	if s.net == nil {
		line = serveLine(t, line)
	}
	cmds := append(slices.Clone(block[:at]), "exec "+line)
	argv := s.argv(netHosts[0], s.script(cmds))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = s.dir, s.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		// a2ad serve shuts down on SIGTERM; anything it left behind goes
		// with its process group.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("a2ad serve did not stop on SIGTERM")
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	ready := make(chan string, 1)
	var out bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if u, ok := strings.CutPrefix(sc.Text(), "a2ad: control plane ready at "); ok {
				ready <- u
			}
		}
		close(ready)
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case url, ok := <-ready:
		if !ok {
			<-exited
			t.Fatalf("%s\nexited before it was ready:\n%s%s", s.script(cmds), out.String(), stderr.String())
		}
		if tls := servesTLS(t, line); tls != strings.HasPrefix(url, "tls://") {
			t.Errorf("%s\nserves %s: TLS %v expected", s.script(cmds), url, tls)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s\nnot ready after 30 s (a2ad serve printed no 'control plane ready')", s.script(cmds))
	}
}

// serveLine returns the a2ad serve line to run on this machine for the
// page's line. A line that listens beyond loopback without a certificate or
// --insecure gets a TLS of its own there, with a CA serve makes; as the
// session listens on 127.0.0.1 instead of the page's 0.0.0.0, it gets --tls,
// which does the same on loopback: the ranks must then trust serve's CA as
// on a cluster.
func serveLine(t *testing.T, line string) string {
	t.Helper()
	if !servesTLS(t, line) || strings.Contains(line, "--tls-cert") {
		return line
	}
	return strings.Replace(line, "a2ad serve ", "a2ad serve --tls ", 1)
}

// servesTLS reports whether an a2ad serve line serves NATS over TLS: with
// --tls or a certificate, or listening beyond loopback without --insecure.
func servesTLS(t *testing.T, line string) bool {
	t.Helper()
	args := strings.Fields(line)
	if slices.Contains(args, "--tls") || slices.Contains(args, "--tls-cert") {
		return true
	}
	listen := "127.0.0.1:4222" // a2ad serve's default
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			listen = v
		} else if a == "--listen" && i+1 < len(args) {
			listen = args[i+1]
		}
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("%q: --listen %q: %v", line, listen, err)
	}
	return !natsd.Loopback(host) && !slices.Contains(args, "--insecure")
}

// runLauncher runs setup then line, a launcher command of block id of
// docs/LAUNCHERS.md, on node0, and checks the ranks it started.
func (s *docSession) runLauncher(t *testing.T, id string, setup []string, line string) {
	name := strings.Fields(line)[0]
	var env []string
	var w want
	scripts := []string{s.script(append(slices.Clone(setup), line))}
	hosts := []string{netHosts[0]}
	switch name {
	case "mpirun":
		// On its own host mpirun passes its whole environment: only the
		// flags show whether ranks on other hosts would get the exports.
		for _, v := range s.exported(t, setup) {
			if !strings.Contains(line+" ", " -x "+v+" ") {
				t.Errorf("%q does not pass %s with -x: the ranks on other hosts would not get it", line, v)
			}
		}
		w = want{launcher: "openmpi", group: regexp.MustCompile(`^openmpi-[0-9]+$`), ranks: 4, local: s.placement(t, line)}
	case "mpiexec":
		w = want{launcher: "pmi", group: regexp.MustCompile(`^job-[0-9]+-[0-9]+$`), ranks: 4, local: s.placement(t, line)}
	case "srun":
		// The batch script's environment: a job of 4 tasks.
		job := strconv.Itoa(int(rand.Uint32() % 1e6))
		env = []string{"SLURM_JOB_ID=" + job, "SLURM_NTASKS=4", "SLURM_NNODES=1"}
		w = want{launcher: "slurm", group: regexp.MustCompile("^slurm-" + job + "-0$"), ranks: 4,
			local: func(r int) (int, int) { return r, 0 }}
	case "torchrun":
		// The page runs node 0's line; node 1 runs the same with --node-rank 1.
		if !strings.Contains(line, "--node-rank 0") {
			t.Fatalf("%q: no --node-rank 0 for node 1 to replace", line)
		}
		scripts = append(scripts, strings.Replace(scripts[0], "--node-rank 0", "--node-rank 1", 1))
		hosts = append(hosts, netHosts[1])
		master := "localhost"
		if s.net != nil {
			master = netHosts[0]
		}
		w = want{launcher: "torchrun", group: regexp.MustCompile(`^torchrun-none-` + master + `-29500$`), ranks: 4,
			local: func(r int) (int, int) { return r % 2, 2 }}
	}
	outs := make([][]byte, len(scripts))
	errs := make([]error, len(scripts))
	done := make(chan int)
	for i, script := range scripts {
		go func() {
			outs[i], errs[i] = s.run(t, hosts[i], script, env)
			done <- i
		}()
	}
	for range scripts {
		<-done
	}
	failed := slices.ContainsFunc(errs, func(err error) bool { return err != nil })
	// The lines known to fail across hosts (doctest.Known) pass on one.
	if k, ok := doctest.KnownBroken(id, line); ok && s.net != nil {
		if !failed {
			t.Errorf("%s: %q passes now: remove its entry from doctest.Known (%s)", id, line, k.Reason)
		} else {
			t.Logf("%s: %q fails, as known: %s\n%s", id, line, k.Reason, bytes.Join(outs, nil))
		}
		return
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s\n%v\n%s", scripts[i], err, outs[i])
		}
	}
	checkRanks(t, bytes.Join(outs, nil), w)
}

// placement returns the local rank and size of each rank an mpirun or
// mpiexec line starts. In the namespaces they are where its host list puts
// them: Open MPI fills node0's 2 slots first, Hydra deals the ranks to the
// hosts in turn, and without a list all run on node0. On one machine they
// are all on it.
func (s *docSession) placement(t *testing.T, line string) func(int) (int, int) {
	switch {
	case s.net != nil && strings.Contains(line, " --host node0:2,node1:2 "):
		return func(r int) (int, int) { return r % 2, 2 }
	case s.net != nil && strings.Contains(line, " -hosts node0,node1 "):
		return func(r int) (int, int) { return r / 2, 2 }
	case s.net != nil && strings.Contains(line, "node1"):
		t.Fatalf("%q: a host list the test does not know: say where it puts the ranks", line)
	}
	return func(r int) (int, int) { return r, 4 }
}

// exported returns the names of the A2A_* variables setup exports.
func (s *docSession) exported(t *testing.T, setup []string) []string {
	t.Helper()
	out, err := s.run(t, netHosts[0], s.script(append(slices.Clone(setup), "env")), nil)
	if err != nil {
		t.Fatalf("%s\n%v\n%s", s.script(setup), err, out)
	}
	var names []string
	for _, kv := range strings.Split(string(out), "\n") {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "A2A_") {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		t.Fatalf("the exports before the launcher lines set no A2A_ variable:\n%s", s.script(setup))
	}
	return names
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
