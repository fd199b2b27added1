// Package natscluster runs a cluster of Debian's nats-server processes on
// loopback for tests: every node with its client, route and monitoring
// ports, the users given (passwords and subject permissions, as a shared
// deployment has them; docs/SECURITY.md), routes that authenticate too, and
// a kill -9 (or a freeze) of any node.
//
// The processes die with the process that started them (Pdeathsig) even
// when a test binary is killed before its cleanups run.
package natscluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/a2a-moe/a2a/internal/natsd"
)

// ErrNoServer means the nats-server binary is not installed (make deps
// installs Debian's).
var ErrNoServer = errors.New("natscluster: nats-server binary not found: run `make deps` (installs Debian's nats-server)")

// Config describes a cluster.
type Config struct {
	// Nodes is the number of servers (default 3).
	Nodes int
	// Users may connect as clients; no one else can. At least one.
	Users []natsd.User
	// Dir holds the configuration files and logs (a test's TempDir).
	Dir string
}

// Cluster is a running cluster. Close stops what is left of it.
type Cluster struct {
	Nodes []*Node
}

// Node is one nats-server process.
type Node struct {
	Name string
	// URL is the client URL, without credentials.
	URL                string
	client, route, mon int
	cmd                *exec.Cmd
	exited             chan struct{}
	log                string
}

// Start starts the cluster and returns once every node has a route to every
// other one, or ctx ends.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return nil, ErrNoServer
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if len(cfg.Users) == 0 || cfg.Dir == "" {
		return nil, errors.New("natscluster: a cluster needs users and a directory")
	}
	ports, err := freePorts(3 * cfg.Nodes)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := range cfg.Nodes {
		c.Nodes = append(c.Nodes, &Node{Name: fmt.Sprintf("n%d", i), client: ports[3*i], route: ports[3*i+1], mon: ports[3*i+2],
			URL: fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i]), exited: make(chan struct{})})
	}
	route := natsd.NewUser("route", nil)
	for _, n := range c.Nodes {
		path := filepath.Join(cfg.Dir, n.Name+".conf")
		if err := os.WriteFile(path, c.config(n, cfg.Users, route), 0o600); err != nil {
			return nil, err
		}
		n.log = filepath.Join(cfg.Dir, n.Name+".log")
		logf, err := os.Create(n.log)
		if err != nil {
			c.Close()
			return nil, err
		}
		n.cmd = exec.Command(bin, "-c", path)
		n.cmd.Stdout, n.cmd.Stderr = logf, logf
		n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = n.cmd.Start()
		logf.Close()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("natscluster: starting %s: %w", n.Name, err)
		}
		go func() { _ = n.cmd.Wait(); close(n.exited) }()
	}
	if err := c.waitRoutes(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// config is node n's configuration file.
func (c *Cluster) config(n *Node, users []natsd.User, route natsd.User) []byte {
	var b bytes.Buffer
	q := strconv.Quote
	fmt.Fprintf(&b, "server_name: %s\nlisten: %s\nhttp: %s\n", q(n.Name), q(n.addr(n.client)), q(n.addr(n.mon)))
	b.WriteString("authorization {\n  users: [\n")
	for _, u := range users {
		fmt.Fprintf(&b, "    {user: %s, password: %s", q(u.Name), q(u.Password))
		if u.Allow != nil {
			allow := make([]string, len(u.Allow))
			for i, s := range u.Allow {
				allow[i] = q(s)
			}
			list := "[" + strings.Join(allow, ", ") + "]"
			fmt.Fprintf(&b, ", permissions: {publish: {allow: %s}, subscribe: {allow: %s}}", list, list)
		}
		b.WriteString("}\n")
	}
	b.WriteString("  ]\n}\n")
	fmt.Fprintf(&b, "cluster {\n  name: \"a2a\"\n  listen: %s\n  authorization { user: %s, password: %s }\n  routes: [\n",
		q(n.addr(n.route)), q(route.Name), q(route.Password))
	for _, o := range c.Nodes {
		if o != n {
			fmt.Fprintf(&b, "    %s\n", q(fmt.Sprintf("nats-route://%s:%s@127.0.0.1:%d", route.Name, route.Password, o.route)))
		}
	}
	b.WriteString("  ]\n}\n")
	return b.Bytes()
}

func (n *Node) addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// waitRoutes waits until every node reports a route to every other.
func (c *Cluster) waitRoutes(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	for _, n := range c.Nodes {
		for {
			got, err := n.routes(ctx, client)
			if err == nil && got == len(c.Nodes)-1 {
				break
			}
			select {
			case <-n.exited:
				return fmt.Errorf("natscluster: %s exited: %s", n.Name, n.Log())
			case <-ctx.Done():
				return fmt.Errorf("natscluster: %s has %d of %d routes (%v): %w", n.Name, got, len(c.Nodes)-1, err, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// routes asks n's monitoring endpoint for its number of routes.
func (n *Node) routes(ctx context.Context, client *http.Client) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.addr(n.mon)+"/routez", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var rz struct {
		NumRoutes int `json:"num_routes"`
	}
	err = json.NewDecoder(resp.Body).Decode(&rz)
	return rz.NumRoutes, err
}

// URL is every node's client URL, comma-separated, as nats.Connect takes a
// server list.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// Kill kills the node with SIGKILL (no goodbye to clients or routes: their
// connections reset) and waits for the process to end.
func (n *Node) Kill() error {
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-n.exited
	return nil
}

// Freeze stops the node with SIGSTOP: its connections stay open and say
// nothing, as with a hung host or a partition. Kill still ends it.
func (n *Node) Freeze() error { return n.cmd.Process.Signal(syscall.SIGSTOP) }

// Log returns what the node wrote to its log so far.
func (n *Node) Log() string {
	b, _ := os.ReadFile(n.log)
	return string(b)
}

// Close kills every node still running and waits for all of them.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			_ = n.Kill()
		}
	}
}

// freePorts returns n distinct free loopback ports (held together while
// picked, so they differ; another process may still take one before the
// server binds it, which makes Start fail rather than misbehave).
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
