//go:build !race

package collective_test

// raceEnabled: built with -race, where goroutines run several times slower.
const raceEnabled = false
