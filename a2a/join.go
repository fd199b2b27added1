package a2a

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/engine"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/internal/cpus"
)

// rankIdentity is what a rank is known by at join: its host identity, which
// finds its same-host peers, and the job secret that signs its messages and
// authenticates its data-plane peers.
type rankIdentity struct {
	host   string
	secret []byte
}

// identity resolves the host identity and the secret of cfg.
func (cfg Config) identity() rankIdentity {
	secret := cfg.Secret
	if secret == "" {
		// Without a configured secret the hello still keeps out strangers
		// that do not know the group name; A2A_SECRET makes it a real key.
		secret = "a2a-group:" + cfg.Group
	}
	host := cfg.Host
	if host == "" {
		host = HostIdentity()
	}
	return rankIdentity{host: host, secret: []byte(secret)}
}

// connectControl connects to the control plane (NATS), reconnecting for
// ever once connected.
func (c *Comm) connectControl() error {
	cfg := c.cfg
	auth, err := cfg.NATSOptions()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.NATSURL, append(auth, nats.Name(fmt.Sprintf("a2a %s rank %d pid %d", cfg.Group, cfg.Rank, os.Getpid())),
		nats.Timeout(5*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		return connectError(cfg, err)
	}
	c.nc = nc
	return nil
}

// defaultListen is the data-plane address of a rank whose Config.Listen is
// empty, given the address of its NATS server: the address of this host that
// routes to the server, port 0, so that ranks of other hosts, which reach the
// same server, can reach it too (NCCL picks its interface by the route to
// its bootstrap root alike). A server on loopback says nothing about other
// hosts: 127.0.0.1:0, reachable from this host only.
func defaultListen(server string) string {
	const local = "127.0.0.1:0"
	host, _, err := net.SplitHostPort(server)
	if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsLoopback() {
		return local
	}
	// A datagram socket's connect only picks the route: nothing is sent.
	c, err := net.Dial("udp", server)
	if err != nil {
		return local
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || ua.IP.IsUnspecified() {
		return local
	}
	return net.JoinHostPort(ua.IP.String(), "0")
}

// rendezvous joins the group on the control plane, announcing this rank's
// data-plane addresses, and learns its rank, the group and its topology.
func (c *Comm) rendezvous(ctx context.Context, id rankIdentity, addresses map[string][]byte) error {
	cfg := c.cfg
	m, err := control.Join(ctx, c.nc, control.JoinConfig{
		Group: cfg.Group, Rank: cfg.Rank, WorldSize: cfg.WorldSize,
		Info: control.NodeInfo{Rank: cfg.Rank, Host: id.host, PID: os.Getpid(), Transports: addresses, Streams: cfg.Streams,
			CPUs: cpus.Format(cpus.Allowed()), Machine: MachineIdentity()},
		HeartbeatInterval: cfg.HeartbeatInterval, PeerTimeout: cfg.PeerTimeout, Logger: c.log,
		Secret: id.secret,
	})
	if err != nil {
		return err
	}
	c.member = m
	c.rank, c.size = m.Rank(), m.Size()
	c.topo = newTopology(m.Nodes())
	return nil
}

// connectData connects the data plane to every peer. A rank that fails to
// connect aborts the group, so its peers stop waiting for it instead of
// running into their deadline; an abort heard meanwhile stops this rank's
// connects too.
func (c *Comm) connectData(ctx context.Context, dp *dataPlane) error {
	m := c.member
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(doneContext{m.Done()}, cancel)
	choice, err := dp.choose(c.rank, m.Nodes())
	if err == nil {
		err = checkDescriptors(c.rank, dp.descriptors(choice, c.cfg.Streams))
	}
	if err == nil {
		c.tr, c.byPeer, err = dp.connect(cctx, c.rank, m.Epoch(), m.Nodes(), choice)
	}
	stop()
	cancel()
	if err != nil {
		// An abort heard meanwhile (it canceled the connects) is the cause;
		// so is one heard within moments of a peer closing its links, which
		// a peer does because a third rank aborted the group.
		if m.Err() != nil || c.awaitPeerCause(0, err) {
			if merr := m.Err(); merr != nil {
				err = merr
			}
		}
		m.Abort(err)
		return err
	}
	return nil
}

// startEngine makes the engine, on the data plane's Demux, and what runs
// on it (readyEngine).
func (c *Comm) startEngine() {
	cfg := c.cfg
	c.share = &sharing{demux: transport.NewDemux(c.tr, c.rank, c.size)}
	c.eng = engine.New(engine.Options{
		Transport: c.tr, Conns: c.share.demux, Rank: c.rank, Size: c.size, Streams: cfg.Streams, Epoch: c.member.Epoch(),
		Waiting: waitPolicy(cfg.Spin, cfg.Yield, c.member.Nodes(), c.topo.machines, c.topo.machineCores, c.rank, cpus.Online()),
		Hosts:   c.topo.hosts, Timeout: cfg.Timeout, Stopped: c.stopped,
	})
	c.readyEngine()
}

// readyEngine makes what runs on the engine: the progress queue, the LL
// policy, the scratch buffers and the rooted collectives' ring check.
func (c *Comm) readyEngine() {
	c.queue = newProgressQueue(c.eng, c.size, &c.life)
	c.ll = c.newLLPolicy()
	c.scratch = newScratch(c.size)
	c.plan.ringCheck.Reset(algo.AlgoRing)
	if c.size > 1 {
		c.plan.ringCheck.Add(algo.Step{Kind: algo.StepSend, Peer: (c.rank + 1) % c.size, Last: true})
		c.plan.ringCheck.Add(algo.Step{Kind: algo.StepRecv, Peer: (c.rank - 1 + c.size) % c.size, Last: true})
		c.plan.ringCheck.EndRound()
	}
}
