package a2a

import (
	"strings"

	"github.com/a2a-moe/a2a/a2a/algo"
	"github.com/a2a-moe/a2a/a2a/transport"
)

// linkClasses are the data planes a Comm may use, by provider name (their
// link class): what each offers, read by the cost model, the LL policy and
// the layers above instead of comparing names.
type linkClasses struct {
	caps map[string]transport.Capabilities
	// local and remote name the classes that price a role no pair of the
	// Comm plays, so that it still has a price: for ranks of one host the
	// first provider whose links map memory, for hosts the last provider,
	// the one of last resort that reaches every rank.
	local, remote string
}

// newLinkClasses reads the classes of providers, in order of preference.
func newLinkClasses(providers []transport.Provider) linkClasses {
	lc := linkClasses{caps: make(map[string]transport.Capabilities, len(providers))}
	for _, p := range providers {
		caps := p.Capabilities()
		lc.caps[p.Name()] = caps
		if lc.local == "" && caps.MapsMemory {
			lc.local = p.Name()
		}
		lc.remote = p.Name()
	}
	if lc.local == "" && len(providers) > 0 {
		lc.local = providers[0].Name()
	}
	return lc
}

// builtin is the cost model's built-in link of every class, with the
// mapped-copy class ("shm-mapped") of each provider that maps registered
// buffers.
func (lc linkClasses) builtin() algo.ClassLinks {
	links := make(algo.ClassLinks, len(lc.caps))
	for name, caps := range lc.caps {
		links[name] = algo.Link{Alpha: caps.Cost.Alpha, Beta: caps.Cost.Beta, Lanes: caps.Cost.Lanes}
		if m := caps.MappedCost; m.Beta > 0 {
			links[name+algo.MappedSuffix] = algo.Link{Alpha: m.Alpha, Beta: m.Beta, Lanes: m.Lanes}
		}
	}
	return links
}

// llCutoff is the LL cutoff of a pair of class under automatic selection,
// for Config.LLBytes llBytes: a class with one-sided slots caps llBytes at
// its slot; one without (or not known) takes llBytes in frames. Under auto
// every pair is quiet (algo.AllToAllVArgs.LLQuiet): a class with slots
// watches them (transport.SlotWatcher).
func (lc linkClasses) llCutoff(class string, llBytes int) int {
	// A mapped-copy class ("shm-mapped") has its provider's slots.
	if slot := lc.caps[strings.TrimSuffix(class, algo.MappedSuffix)].SlotBytes; slot > 0 {
		return min(llBytes, slot)
	}
	return llBytes
}

// defaultClasses are the classes of DefaultProviders.
func defaultClasses() linkClasses { return newLinkClasses(DefaultProviders(Config{})) }

// BuiltinLinks is the cost model's built-in link of each class of
// DefaultProviders, by name: how a Comm prices a role where nothing was
// measured (`a2ad plan` prices with it as a Comm does).
func BuiltinLinks() algo.ClassLinks { return defaultClasses().builtin() }

// ClassLLCutoff is the LL cutoff under automatic selection of a pair whose
// link class is class, one of DefaultProviders, for Config.LLBytes llBytes:
// llBytes capped by the class's LL slot, or all of llBytes in frames for a
// class without slots. `a2ad plan` prices with it as a Comm does.
func ClassLLCutoff(class string, llBytes int) int { return defaultClasses().llCutoff(class, llBytes) }

// ClassCapabilities says what the links of class, one of DefaultProviders,
// offer (the zero Capabilities for a class not among them).
func ClassCapabilities(class string) transport.Capabilities { return defaultClasses().caps[class] }

// PeerCapabilities says what the data plane that links this rank with rank
// offers (the zero Capabilities for this rank itself): whether the two
// ranks may map each other's memory, its LL slot, its built-in cost.
func (c *Comm) PeerCapabilities(rank int) transport.Capabilities {
	return c.plan.classes.caps[c.PeerTransport(rank)]
}
