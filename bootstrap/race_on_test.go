//go:build race

package bootstrap_test

// raceEnabled: built with -race, where goroutines run several times slower.
const raceEnabled = true
