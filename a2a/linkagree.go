package a2a

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
)

// Link table settings (Config.Links).
const (
	LinksDefault = ""      // the providers' built-in links (transport.Capabilities.Cost)
	LinksProbe   = "probe" // measured at join by rank 0 against one peer of each class
)

// Probe sizes and repetitions: enough to average out scheduling noise on a
// small machine, little enough that a probing join costs a few milliseconds.
const (
	probeSmall      = 8
	probeLarge      = 256 << 10
	probeSmallReps  = 40
	probeLargeReps  = 8
	probeWarmupReps = 4
)

// Links returns the link table every rank of the communicator agreed on at
// join (rank 0's): what the cost model prices algorithms with.
func (c *Comm) Links() algo.Links { return c.plan.links }

// agreeLinks gives every rank rank 0's link table: the built-in defaults, a
// file written by `a2ad tune` (Config.Links is its path), or one rank 0
// measures now ("probe") by ping-pong with its first peer of each link
// class. Rank 0 broadcasts the table (when probing, first whom it probes and
// then the table), so every rank prices candidates identically even when
// their settings differ; a join without probing costs one small Broadcast.
func (c *Comm) agreeLinks(ctx context.Context) error {
	localClass, remoteClass := c.linkClasses()
	c.plan.links = c.plan.classes.builtin().Table(localClass, remoteClass)
	if c.rank == 0 && c.cfg.Links != LinksDefault && c.cfg.Links != LinksProbe {
		l, err := algo.LoadLinks(c.cfg.Links)
		if err != nil {
			return fault.Wrap(fault.ErrInvalidArgument, c.rank, err, "A2A_LINKS")
		}
		c.plan.links = l.For(localClass, remoteClass, c.plan.classes.builtin())
	}
	if c.size < 2 {
		return nil
	}
	// One broadcast carries the table, or, when rank 0 probes, the peers it
	// probes; a second one then carries the measured table.
	msg := make([]byte, 24+linksBytes) // probe?, local peer, remote peer, table with classes
	local, remote := -1, -1
	if c.rank == 0 {
		if c.cfg.Links == LinksProbe {
			for r := 1; r < c.size; r++ {
				if c.topo.hosts[r] == c.topo.hosts[0] && local < 0 {
					local = r
				}
				if c.topo.hosts[r] != c.topo.hosts[0] && remote < 0 {
					remote = r
				}
			}
			binary.LittleEndian.PutUint64(msg[0:], 1)
		}
		binary.LittleEndian.PutUint64(msg[8:], uint64(int64(local)))
		binary.LittleEndian.PutUint64(msg[16:], uint64(int64(remote)))
		encodeLinks(msg[24:], c.plan.links)
	}
	if err := c.Broadcast(ctx, msg, 0); err != nil {
		return err
	}
	table := msg[24:]
	if binary.LittleEndian.Uint64(msg[0:]) == 1 {
		local = int(int64(binary.LittleEndian.Uint64(msg[8:])))
		remote = int(int64(binary.LittleEndian.Uint64(msg[16:])))
		for _, p := range []struct {
			peer int
			link *algo.Link
		}{{local, &c.plan.links.Local}, {remote, &c.plan.links.Remote}} {
			if p.peer < 0 || (c.rank != 0 && c.rank != p.peer) {
				continue
			}
			l, err := c.probeLink(ctx, p.peer)
			if err != nil {
				return err
			}
			if c.rank == 0 {
				*p.link = l
			}
		}
		if c.rank == 0 {
			encodeLinks(table, c.plan.links)
		}
		if err := c.Broadcast(ctx, table, 0); err != nil {
			return err
		}
	}
	c.plan.links = decodeLinks(table)
	c.plan.allReduce.valid = false // the choice reads the links
	return nil
}

// probeLink runs rank 0's ping-pong with peer (rank 0 measures; peer echoes)
// and returns, on rank 0, the link it saw: Alpha is half the small round
// trip, Beta the extra half round trip of a large message per byte.
func (c *Comm) probeLink(ctx context.Context, peer int) (algo.Link, error) {
	buf := make([]byte, probeLarge)
	other := peer
	if c.rank != 0 {
		other = 0
	}
	pingPong := func(size, reps int) (time.Duration, error) {
		var total time.Duration
		for i := range probeWarmupReps + reps {
			start := time.Now()
			if c.rank == 0 {
				if err := c.Send(ctx, buf[:size], other, i); err != nil {
					return 0, err
				}
				if _, err := c.Recv(ctx, buf[:size], other, i); err != nil {
					return 0, err
				}
			} else {
				if _, err := c.Recv(ctx, buf[:size], other, i); err != nil {
					return 0, err
				}
				if err := c.Send(ctx, buf[:size], other, i); err != nil {
					return 0, err
				}
			}
			if i >= probeWarmupReps {
				total += time.Since(start)
			}
		}
		return total / time.Duration(reps), nil
	}
	small, err := pingPong(probeSmall, probeSmallReps)
	if err != nil {
		return algo.Link{}, err
	}
	large, err := pingPong(probeLarge, probeLargeReps)
	if err != nil {
		return algo.Link{}, err
	}
	alpha := small.Seconds() / 2
	// A large message that came back faster than a small one (noise) still
	// gets a positive, finite Beta.
	beta := max((large.Seconds()/2-alpha)/probeLarge, 1e-12)
	return algo.Link{Alpha: alpha, Beta: beta, Lanes: 1}, nil
}

// linkClasses names the data planes that play the link table's roles on
// this rank: the provider of its first peer on this host and of its first
// peer on another host. A role no pair plays is named as linkClasses says,
// so that it still has a price. Rank 0's names travel with the table, so
// every rank holds the same.
func (c *Comm) linkClasses() (local, remote string) {
	local, remote = c.plan.classes.local, c.plan.classes.remote
	foundLocal, foundRemote := false, false
	for r := range c.size {
		name := c.PeerTransport(r)
		switch {
		case name == "":
		case c.topo.hosts[r] == c.topo.hosts[c.rank] && !foundLocal:
			local, foundLocal = name, true
		case c.topo.hosts[r] != c.topo.hosts[c.rank] && !foundRemote:
			remote, foundRemote = name, true
		}
	}
	return local, remote
}

// linksBytes is the size of an encoded link table: alpha, beta and lanes of
// each role as float64s, then each role's class name in classBytes.
const (
	classBytes = 16
	linksBytes = 48 + 2*classBytes
)

func encodeLinks(b []byte, l algo.Links) {
	for i, v := range []float64{l.Local.Alpha, l.Local.Beta, float64(l.Local.Lanes),
		l.Remote.Alpha, l.Remote.Beta, float64(l.Remote.Lanes)} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	// Class names are provider names: short words, cut to fit.
	clear(b[48:linksBytes])
	copy(b[48:48+classBytes], l.LocalClass)
	copy(b[48+classBytes:linksBytes], l.RemoteClass)
}

func decodeLinks(b []byte) algo.Links {
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])) }
	name := func(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }
	return algo.Links{
		Local:       algo.Link{Alpha: f(0), Beta: f(1), Lanes: int(f(2))},
		Remote:      algo.Link{Alpha: f(3), Beta: f(4), Lanes: int(f(5))},
		LocalClass:  name(b[48 : 48+classBytes]),
		RemoteClass: name(b[48+classBytes : linksBytes]),
	}
}
