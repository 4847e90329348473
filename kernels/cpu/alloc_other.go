//go:build !linux

package cpu

// allocPanel returns n zeroed elements for packed panels.
func allocPanel[T float](n int) []T { return make([]T, n) }
