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
	// The mapped-copy class: two sizes above shm's zero-copy threshold, so
	// both go by mapped copies, from registered buffers.
	probeMappedSmall = 16 << 10
	probeMappedLarge = 1 << 20
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
		if err := c.probeMappedRole(ctx, local); err != nil {
			return err
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

// probeMappedRole measures the mapped-copy class with local, rank 0's
// first peer on its host, when the table has that class (shm): rank 0 and
// local ping-pong from registered buffers. Other ranks return at once.
func (c *Comm) probeMappedRole(ctx context.Context, local int) error {
	if local < 0 || c.plan.links.MappedClass == "" || (c.rank != 0 && c.rank != local) {
		return nil
	}
	buf, err := AllocBuffer(probeMappedLarge)
	if err != nil {
		return err
	}
	// Nothing holds it once the ping-pong is done: FreeBuffer cannot fail.
	defer func() { _ = FreeBuffer(buf) }()
	peer := local
	if c.rank != 0 {
		peer = 0
	}
	small, err := c.pingPong(ctx, buf, peer, probeMappedSmall, probeLargeReps)
	if err != nil {
		return err
	}
	large, err := c.pingPong(ctx, buf, peer, probeMappedLarge, probeLargeReps)
	if err != nil {
		return err
	}
	if c.rank == 0 {
		beta := max((large.Seconds()-small.Seconds())/2/(probeMappedLarge-probeMappedSmall), 1e-12)
		alpha := max(small.Seconds()/2-beta*probeMappedSmall, 0)
		c.plan.links.Mapped = algo.Link{Alpha: alpha, Beta: beta, Lanes: 1}
	}
	return nil
}

// pingPong times reps round trips of size bytes of buf between rank 0
// (which sends first) and peer, after probeWarmupReps untimed ones, and
// returns the mean round trip.
func (c *Comm) pingPong(ctx context.Context, buf []byte, peer, size, reps int) (time.Duration, error) {
	var total time.Duration
	for i := range probeWarmupReps + reps {
		start := time.Now()
		if c.rank == 0 {
			if err := c.Send(ctx, buf[:size], peer, i); err != nil {
				return 0, err
			}
			if _, err := c.Recv(ctx, buf[:size], peer, i); err != nil {
				return 0, err
			}
		} else {
			if _, err := c.Recv(ctx, buf[:size], peer, i); err != nil {
				return 0, err
			}
			if err := c.Send(ctx, buf[:size], peer, i); err != nil {
				return 0, err
			}
		}
		if i >= probeWarmupReps {
			total += time.Since(start)
		}
	}
	return total / time.Duration(reps), nil
}

// probeLink runs rank 0's ping-pong with peer (rank 0 measures; peer echoes)
// and returns, on rank 0, the link it saw: Alpha is half the small round
// trip, Beta the extra half round trip of a large message per byte.
func (c *Comm) probeLink(ctx context.Context, peer int) (algo.Link, error) {
	buf := make([]byte, probeLarge) // the heap: not registered
	other := peer
	if c.rank != 0 {
		other = 0
	}
	small, err := c.pingPong(ctx, buf, other, probeSmall, probeSmallReps)
	if err != nil {
		return algo.Link{}, err
	}
	large, err := c.pingPong(ctx, buf, other, probeLarge, probeLargeReps)
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
// the local, remote and mapped classes as float64s, then each one's name in
// classBytes.
const (
	classBytes = 16
	linksBytes = 72 + 3*classBytes
)

func encodeLinks(b []byte, l algo.Links) {
	for i, v := range []float64{l.Local.Alpha, l.Local.Beta, float64(l.Local.Lanes),
		l.Remote.Alpha, l.Remote.Beta, float64(l.Remote.Lanes),
		l.Mapped.Alpha, l.Mapped.Beta, float64(l.Mapped.Lanes)} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	// Class names are provider names: short words, cut to fit.
	clear(b[72:linksBytes])
	for i, name := range []string{l.LocalClass, l.RemoteClass, l.MappedClass} {
		copy(b[72+i*classBytes:72+(i+1)*classBytes], name)
	}
}

func decodeLinks(b []byte) algo.Links {
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])) }
	name := func(i int) string { return string(bytes.TrimRight(b[72+i*classBytes:72+(i+1)*classBytes], "\x00")) }
	return algo.Links{
		Local:       algo.Link{Alpha: f(0), Beta: f(1), Lanes: int(f(2))},
		Remote:      algo.Link{Alpha: f(3), Beta: f(4), Lanes: int(f(5))},
		Mapped:      algo.Link{Alpha: f(6), Beta: f(7), Lanes: int(f(8))},
		LocalClass:  name(0),
		RemoteClass: name(1),
		MappedClass: name(2),
	}
}
