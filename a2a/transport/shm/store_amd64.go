package shm

// storeRelease stores v at addr with release ordering: every store before it
// is visible to another core before this one. On amd64 a plain MOV does that
// (stores are never reordered with older stores), where atomic.StoreUint64
// is an XCHG, which also waits for every earlier store to reach its cache
// line: with a peer's line to fetch, ~100 ns. Being assembly, the call also
// keeps the compiler from moving the stores before it past it.
//
//go:noescape
func storeRelease(addr *uint64, v uint64)
