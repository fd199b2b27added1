package a2a

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/a2a/transport"
	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/a2a/transport/tcp"
	"github.com/a2a-moe/a2a/a2a/transport/verbs"
)

// DefaultProviders is the data planes a Comm tries, in order of preference:
// shared memory between ranks of one host, RDMA verbs where both ranks have
// a device (unavailable, and left out, where there is no libibverbs or no
// active port), then TCP. Every pair of ranks
// talks through the first provider both announced that reaches the other.
// Ranks of one group must use the same list.
func DefaultProviders(cfg Config) []transport.Provider {
	return []transport.Provider{
		shm.Provider{},
		verbs.Provider{},
		tcp.Provider{ListenAddr: cfg.Listen},
	}
}

// allProviders is Config.Providers or the defaults.
func (cfg Config) allProviders() []transport.Provider {
	if cfg.Providers != nil {
		return cfg.Providers
	}
	return DefaultProviders(cfg)
}

// providers is the list Join uses: allProviders, cut to the one
// Config.Transport forces.
func (cfg Config) providers() ([]transport.Provider, error) {
	all := cfg.allProviders()
	if cfg.Transport == "" || cfg.Transport == "auto" {
		return all, nil
	}
	names := make([]string, len(all))
	for i, p := range all {
		if p.Name() == cfg.Transport {
			return all[i : i+1], nil
		}
		names[i] = p.Name()
	}
	return nil, fault.New(fault.ErrInvalidArgument, -1, "transport %q: auto or one of %s (A2A_TRANSPORT)", cfg.Transport, strings.Join(names, ", "))
}

// dataPlane is this rank's endpoints between Listen and Connect.
type dataPlane struct {
	providers []transport.Provider
	endpoints []transport.Endpoint // by provider; nil where Listen failed
	// unavailable says why each provider without an endpoint has none.
	unavailable []error
}

// listen prepares an endpoint of every provider. Under auto selection a
// provider that cannot serve here is left out (its reason kept for the
// errors of peers nothing reaches); a forced one fails the join.
func listen(ctx context.Context, cfg Config, self transport.Self) (*dataPlane, error) {
	providers, err := cfg.providers()
	if err != nil {
		return nil, err
	}
	dp := &dataPlane{providers: providers, endpoints: make([]transport.Endpoint, len(providers)), unavailable: make([]error, len(providers))}
	forced := len(providers) == 1 && cfg.Transport != "" && cfg.Transport != "auto"
	for i, p := range providers {
		ep, err := p.Listen(ctx, self)
		if err != nil {
			if forced {
				return nil, fault.Wrap(fault.ErrInvalidArgument, self.Rank, err, "A2A_TRANSPORT=%s: %s cannot serve on this rank", p.Name(), p.Name())
			}
			cfg.Logger.Debug("a2a: data plane unavailable", "transport", p.Name(), "err", err)
			dp.unavailable[i] = err
			continue
		}
		dp.endpoints[i] = ep
	}
	return dp, nil
}

// addresses is what this rank announces at rendezvous: every endpoint's
// address by provider name.
func (dp *dataPlane) addresses() map[string][]byte {
	out := make(map[string][]byte, len(dp.endpoints))
	for i, ep := range dp.endpoints {
		if ep != nil {
			out[dp.providers[i].Name()] = ep.Address()
		}
	}
	return out
}

// close releases the endpoints that no Connect took over.
func (dp *dataPlane) close() {
	for i, ep := range dp.endpoints {
		if ep != nil {
			ep.Close()
			dp.endpoints[i] = nil
		}
	}
}

// choose picks, for every peer, the first provider both ranks announced
// that reaches it: its index in dp.providers by rank (-1 for this rank).
// Both ranks of a pair decide from what both announced, so they agree. A
// peer no provider reaches fails the join with every provider's reason.
// descriptors is how many file descriptors the links of choice (see choose)
// hold open with streams streams per peer.
func (dp *dataPlane) descriptors(choice []int, streams int) int {
	n := 0
	for _, i := range choice {
		if i >= 0 {
			c := dp.providers[i].Capabilities()
			n += c.StreamDescriptors*streams + c.PeerDescriptors
		}
	}
	return n
}

func (dp *dataPlane) choose(rank int, nodes []control.NodeInfo) ([]int, error) {
	peer := func(r int, name string) transport.Peer {
		return transport.Peer{Rank: r, Host: nodes[r].Host, PID: nodes[r].PID, Address: nodes[r].Transports[name]}
	}
	choice := make([]int, len(nodes))
	for r := range nodes {
		choice[r] = -1
		if r == rank {
			continue
		}
		var why []string
		for i, p := range dp.providers {
			name := p.Name()
			ep := dp.endpoints[i]
			if ep == nil {
				why = append(why, fmt.Sprintf("%s: unavailable on rank %d: %v", name, rank, dp.unavailable[i]))
				continue
			}
			if nodes[r].Transports[name] == nil {
				why = append(why, fmt.Sprintf("%s: rank %d announced none", name, r))
				continue
			}
			if err := ep.Reaches(peer(rank, name), peer(r, name)); err != nil {
				why = append(why, err.Error())
				continue
			}
			choice[r] = i
			break
		}
		if choice[r] < 0 {
			return nil, fault.New(fault.ErrInvalidArgument, r, "no data plane links ranks %d and %d: %s", rank, r, strings.Join(why, "; "))
		}
	}
	return choice, nil
}

// connect connects every provider that reaches some peer, all at once (each
// waits for its peers, which connect the same providers), and composes the
// transports: one Transport per peer. Endpoints no peer needs are closed;
// a group of one connects the first endpoint with no peers, so the Comm
// still has a transport to park on.
func (dp *dataPlane) connect(ctx context.Context, rank int, epoch uint32, nodes []control.NodeInfo, choice []int) (transport.Transport, []transport.Transport, error) {
	peersOf := make([][]int, len(dp.providers))
	for r, i := range choice {
		if i >= 0 {
			peersOf[i] = append(peersOf[i], r)
		}
	}
	if len(nodes) == 1 {
		for i, ep := range dp.endpoints {
			if ep != nil {
				peersOf[i] = []int{}
				break
			}
		}
	}
	parts := make([]transport.Transport, len(dp.providers))
	errs := make([]error, len(dp.providers))
	// The first failure stops the other connects instead of leaving them
	// to wait for peers that will not come.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, ep := range dp.endpoints {
		if ep == nil || peersOf[i] == nil {
			continue
		}
		dp.endpoints[i] = nil // Connect owns it now, also when it fails
		g := transport.Group{Rank: rank, Size: len(nodes), Epoch: epoch, Peers: make([]transport.Peer, len(nodes))}
		for r, n := range nodes {
			g.Peers[r] = transport.Peer{Rank: r, Host: n.Host, PID: n.PID, Address: n.Transports[dp.providers[i].Name()]}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if parts[i], errs[i] = ep.Connect(ctx, g, peersOf[i]); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	dp.close()
	used := slices.DeleteFunc(slices.Clone(parts), func(t transport.Transport) bool { return t == nil })
	if err := firstError(errs); err != nil {
		for _, t := range used {
			t.Close()
		}
		return nil, nil, err
	}
	byPeer := make([]transport.Transport, len(nodes))
	for r, i := range choice {
		if i >= 0 {
			byPeer[r] = parts[i]
		}
	}
	if len(used) == 1 {
		return used[0], byPeer, nil
	}
	mixed, err := transport.NewMixed(used, byPeer)
	if err != nil {
		for _, t := range used {
			t.Close()
		}
		return nil, nil, err
	}
	return mixed, byPeer, nil
}

// firstError is the most telling of errs: a peer's loss or a mismatch over
// the timeouts and aborts the other connects may see because of it.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		switch {
		case err == nil:
		case first == nil:
			first = err
		case errors.Is(first, fault.ErrTimeout) || errors.Is(first, fault.ErrAborted):
			first = err
		}
	}
	return first
}
