package main

import (
	"sync"
	"time"
)

// peakGFLOPS runs the FMA loop (or, with bf16, the VDPBF16PS loop) on threads
// goroutines and returns the best rate.
func peakGFLOPS(threads int, minTime time.Duration, bf16 bool) float64 {
	const iters = 1 << 22
	loop, flops := fmaLoop, 12*16*2.0 // 12 FMAs of 16 lanes, 2 flops each
	if bf16 {
		loop, flops = dpbf16Loop, 24*16*4.0 // 24 VDPBF16PS of 16 lanes, 2 products and 2 adds each
	}
	best := 0.0
	start := time.Now()
	for time.Since(start) < minTime {
		var wg sync.WaitGroup
		t := time.Now()
		for i := 0; i < threads; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); loop(iters) }()
		}
		wg.Wait()
		best = max(best, float64(threads)*iters*flops/time.Since(t).Seconds()/1e9)
	}
	return best
}
