package main

import "golang.org/x/sys/cpu"

// fmaLoop runs n iterations of 12 independent 16-lane float32 FMAs (AVX-512).
//
//go:noescape
func fmaLoop(n int)

// dpbf16Loop runs n iterations of 24 independent VDPBF16PS (AVX512_BF16).
//
//go:noescape
func dpbf16Loop(n int)

// hasDPBF16 reports whether dpbf16Loop runs here.
func hasDPBF16() bool { return cpu.X86.HasAVX512BF16 }
