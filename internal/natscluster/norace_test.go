//go:build !race

package natscluster

const raceEnabled = false
