package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A testNet is the two hosts of the pages, node0 and node1, as network
// namespaces of this machine joined by a veth pair, as the test bed
// (scripts/testbed.sh) makes its hosts: each has lo and eth0, and knows both
// names (/etc/netns/NS/hosts, which ip netns exec mounts over /etc/hosts).
// An ssh stand-in on PATH runs a command "on" a host in its namespace, which
// is how mpirun and mpiexec start their daemons there.
type testNet struct {
	ns     map[string]string // host name -> namespace
	addr   map[string]string // host name -> its address on eth0
	sshDir string            // holds the ssh stand-in
}

// netHosts are the hosts the pages name, in the order of their addresses.
var netHosts = []string{"node0", "node1"}

// nsPrefix starts the names of this process's namespaces: a later run
// deletes those whose process is gone (a test killed before its cleanup).
const nsPrefix = "a2a-doc-"

// newTestNet makes the namespaces; they, the processes left in them and
// their /etc/netns files go when the test ends. It needs root.
func newTestNet(t *testing.T) *testNet {
	t.Helper()
	removeStaleNets(t)
	n := &testNet{ns: map[string]string{}, addr: map[string]string{}, sshDir: t.TempDir()}
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for i, h := range netHosts {
		n.ns[h] = fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), h)
		n.addr[h] = fmt.Sprintf("10.78.0.%d", i+1)
		fmt.Fprintf(&hosts, "%s %s\n", n.addr[h], h)
	}
	_, err := os.Stat("/etc/netns")
	made := os.IsNotExist(err)
	t.Cleanup(func() {
		for _, ns := range n.ns {
			deleteNet(ns)
		}
		if made {
			_ = os.Remove("/etc/netns") // only if empty: another's files stay
		}
	})
	a, b := n.ns[netHosts[0]], n.ns[netHosts[1]]
	steps := [][]string{{"netns", "add", a}, {"netns", "add", b},
		{"-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b}}
	for _, h := range netHosts {
		steps = append(steps, []string{"-n", n.ns[h], "addr", "add", n.addr[h] + "/24", "dev", "eth0"},
			[]string{"-n", n.ns[h], "link", "set", "lo", "up"}, []string{"-n", n.ns[h], "link", "set", "eth0", "up"})
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range n.ns {
		dir := filepath.Join("/etc/netns", ns)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// ssh [options] HOST COMMAND...: the options mpirun and Hydra give
	// (-x, -o K=V, ...) mean nothing here; the command runs in HOST's
	// namespace through a shell, as sshd would run it.
	var cases strings.Builder
	for _, h := range netHosts {
		fmt.Fprintf(&cases, "%s) ns=%s ;;\n", h, n.ns[h])
	}
	ssh := fmt.Sprintf(`#!/bin/sh
# ssh stand-in of cmd/a2acheck's doc tests: the hosts are network namespaces.
while [ $# -gt 0 ]; do
	case $1 in
	-[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
	-*) shift ;;
	*) break ;;
	esac
done
host=$1
shift
case $host in
%s*) echo "ssh stand-in: no host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
`, cases.String())
	if err := os.WriteFile(filepath.Join(n.sshDir, "ssh"), []byte(ssh), 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

// argv returns the command line that runs argv on host.
func (n *testNet) argv(host string, argv ...string) []string {
	// A host has its own name too (a2ad serve's certificate names it, as
	// on a cluster): a UTS namespace per command, named as the host.
	return append([]string{"ip", "netns", "exec", n.ns[host], "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, host}, argv...)
}

// deleteNet kills what runs in namespace ns, deletes it and its /etc/netns
// files.
func deleteNet(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = exec.Command("ip", "netns", "delete", ns).Run()
	_ = os.RemoveAll(filepath.Join("/etc/netns", ns))
}

// removeStaleNets deletes the namespaces of earlier runs whose process is
// gone.
func removeStaleNets(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		pid, _, _ := strings.Cut(strings.TrimPrefix(f[0], nsPrefix), "-")
		if p, err := strconv.Atoi(pid); err == nil && syscall.Kill(p, 0) != nil {
			deleteNet(f[0])
		}
	}
}
