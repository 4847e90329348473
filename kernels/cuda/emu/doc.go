// Package emu runs the cuda provider's CUDA C kernels on the CPU to test
// their arithmetic; it is built with -tags cudaemu (see emu.go).
package emu
