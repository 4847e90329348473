package main

import (
	"sync"
	"time"
)

// peakGFLOPS runs the FMA loop on threads goroutines and returns the best rate.
func peakGFLOPS(threads int, minTime time.Duration) float64 {
	const iters = 1 << 22
	best := 0.0
	start := time.Now()
	for time.Since(start) < minTime {
		var wg sync.WaitGroup
		t := time.Now()
		for i := 0; i < threads; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); fmaLoop(iters) }()
		}
		wg.Wait()
		// fmaLoop does 12 FMAs of 16 lanes (2 flops each) per iteration.
		best = max(best, float64(threads)*iters*12*16*2/time.Since(t).Seconds()/1e9)
	}
	return best
}
