package doctest

import "slices"

// A Broken is a documented command known to fail today. The tests still run
// it: while it fails they only log it, and once it passes they fail until its
// entry is removed, so that the list only shrinks.
type Broken struct {
	Block  string // Block.ID: page#N
	Cmd    string // the command line, without its comment (Bare)
	Reason string
}

// Known lists the documented commands that fail today, with why: each is
// being fixed elsewhere or has been reported.
var Known = []Broken{}

// KnownBroken returns the entry of Known for the command cmd of block id.
func KnownBroken(id, cmd string) (Broken, bool) {
	i := slices.IndexFunc(Known, func(k Broken) bool { return k.Block == id && k.Cmd == Bare(cmd) })
	if i < 0 {
		return Broken{}, false
	}
	return Known[i], true
}
