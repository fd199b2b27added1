//go:build race

package a2a

// raceEnabled: the tests run under the race detector, which slows them
// several times; a test may then run a smaller matrix.
const raceEnabled = true
