// Package dispatch will hold MoE dispatch and combine built on a2a.Comm: pack
// tokens by destination (package routing), exchange counts, AllToAllV the
// tokens to the ranks owning their experts, and run the reverse exchange with
// gate-weighted un-permutation. See docs/ARCHITECTURE.md; filled by the MoE issue.
package dispatch
