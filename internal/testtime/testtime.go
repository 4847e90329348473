// Package testtime scales the time limits of tests to the machine they run
// on. A limit a test asserts ("the peers fail within 2 s") is a property of
// the code on an idle machine; under the race detector (goroutines several
// times slower) or beside other work it takes longer without the code being
// wrong. Scale multiplies a limit by a factor: MESHRUN_TEST_TIME_SCALE when
// set (CI on a loaded machine, a slow runner), else 1, and 4 under -race on
// top. Tests assert scaled limits; where a time is not the point, they assert
// the order of events instead.
package testtime

import (
	"os"
	"strconv"
	"time"
)

// Env names the factor's environment variable.
const Env = "MESHRUN_TEST_TIME_SCALE"

// raceFactor is how much slower the race detector makes the code that
// times are asserted on (goroutine scheduling, channel and lock traffic).
const raceFactor = 4

// Factor is the factor limits are multiplied by.
func Factor() float64 {
	f := 1.0
	if v, err := strconv.ParseFloat(os.Getenv(Env), 64); err == nil && v >= 1 {
		f = v
	}
	if race {
		f *= raceFactor
	}
	return f
}

// Scale returns limit d multiplied by Factor.
func Scale(d time.Duration) time.Duration { return time.Duration(float64(d) * Factor()) }

// Race reports whether the binary was built with -race.
func Race() bool { return race }
