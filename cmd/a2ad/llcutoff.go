package main

import (
	"fmt"
	"strings"

	"github.com/a2a-moe/a2a/a2a"
)

// llBytesUsage describes the LL cutoff setting where a command takes it, so
// that every tool states the library's one default the same way.
var llBytesUsage = fmt.Sprintf("largest block sent by the LL protocol, as A2A_LL_BYTES (the library's default, a2a.DefaultLLBytes, is %d); each pair's data plane caps it at its slot (shm: %d), a negative value leaves LL out of auto's choice",
	a2a.DefaultLLBytes, a2a.ClassCapabilities("shm").SlotBytes)

// pairLLCutoff is the LL cutoff of a pair whose data plane is class, for the
// setting llBytes (A2A_LL_BYTES; 0: the default), as a Comm computes it
// (a2a.ClassLLCutoff); -1 when llBytes turns LL off.
func pairLLCutoff(class string, llBytes int) int {
	switch {
	case llBytes < 0:
		return -1
	case llBytes == 0:
		llBytes = a2a.DefaultLLBytes
	}
	return a2a.ClassLLCutoff(class, llBytes)
}

// llNote says up to which block size c's automatic choice sends by LL, per
// data plane of its peers ("shm:4096,tcp:4096"), or "off". That cutoff is
// where a bench's rows stop showing ll.
func llNote(c *a2a.Comm) string {
	cfg := c.Config()
	if (cfg.Algo != "" && cfg.Algo != "ll") || cfg.LLBytes < 0 {
		return "off"
	}
	var parts []string
	seen := map[string]bool{}
	for r := range c.Size() {
		class := c.PeerTransport(r)
		if r == c.Rank() || seen[class] {
			continue
		}
		seen[class] = true
		parts = append(parts, fmt.Sprintf("%s:%d", class, pairLLCutoff(class, cfg.LLBytes)))
	}
	if len(parts) == 0 {
		return "off"
	}
	return strings.Join(parts, ",")
}
