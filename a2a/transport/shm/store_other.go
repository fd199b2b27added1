//go:build !amd64

package shm

import "sync/atomic"

// storeRelease stores v at addr with (at least) release ordering; see the
// amd64 version.
func storeRelease(addr *uint64, v uint64) { atomic.StoreUint64(addr, v) }
