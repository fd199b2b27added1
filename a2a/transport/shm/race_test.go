//go:build race

package shm

// raceEnabled: the tests run under the race detector, which slows them
// several times; a test may then move fewer bytes.
const raceEnabled = true
