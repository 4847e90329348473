//go:build !amd64 || purego

package collective

// reduceVec has no vector code on this platform: reduceInto does all the work.
func reduceVec[T Float](dst, src []T, op ReduceOp) int { return 0 }
