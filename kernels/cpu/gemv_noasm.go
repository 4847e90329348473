//go:build !amd64 || noasm

package cpu

var (
	dot32  dotFunc[float32]  = dotGo[float32]
	axpy32 axpyFunc[float32] = axpyGo[float32]
)
