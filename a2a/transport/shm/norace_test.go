//go:build !race

package shm

// raceEnabled: see race_test.go.
const raceEnabled = false
