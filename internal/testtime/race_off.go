//go:build !race

package testtime

const race = false
