package placement

import "math"

// Bounds on what the package describes and plans. Every Mesh and every valid
// Spec is within them, so their sizes, element counts and byte counts are
// computed without overflow.
const (
	// MaxDevices is the most ranks a mesh may hold.
	MaxDevices = 1 << 16
	// MaxMeshDims is the most dims a mesh may have.
	MaxMeshDims = 8
	// MaxTensorDims is the most dims a spec's tensor may have.
	MaxTensorDims = 16
	// MaxElems is the most elements a tensor (a spec's global shape) may hold,
	// and the longest any of its dims may be: 2^48, as package tensor allows,
	// so that its bytes in any dtype fit an int64 many times over.
	MaxElems = 1 << 48
)

// MulSize returns a*b for sizes a, b >= 0, and false when either is negative
// or the product does not fit an int64. Every product of sizes (elements,
// bytes, ranks, multiply-adds) that may come from a user goes through it.
func MulSize(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, false
	}
	return a * b, true
}

// ShapeElems is the number of elements of shape (1 for a scalar), and false
// when a dim is negative or the product does not fit an int64.
func ShapeElems(shape []int) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		var ok bool
		if n, ok = MulSize(n, int64(d)); !ok {
			return 0, false
		}
	}
	return n, true
}

// SatAdd is a+b for a, b >= 0, saturating at math.MaxInt64: plan costs sum
// the elements every rank sends, and a strategy's work multiplies letters'
// sizes, which for the largest tensors on the largest meshes exceed an int64;
// beyond it they all compare equal, and they order plans, never print.
func SatAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// SatMul is a*b for a, b >= 0, saturating at math.MaxInt64 like SatAdd.
func SatMul(a, b int64) int64 {
	if p, ok := MulSize(a, b); ok {
		return p
	}
	return math.MaxInt64
}
