package main

// fmaLoop runs n iterations of 12 independent 16-lane float32 FMAs (AVX-512).
//
//go:noescape
func fmaLoop(n int)
