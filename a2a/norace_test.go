//go:build !race

package a2a

// raceEnabled: see race_test.go.
const raceEnabled = false
