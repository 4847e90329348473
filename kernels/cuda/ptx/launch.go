package ptx

import (
	"crypto/sha256"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/meshrun/meshrun/kernels"
)

// Launch shapes of the kernels. The sum of the
// mean squared error is reduced in a fixed order: MSEThreads partial sums
// (one per thread of a fixed grid), SumThreads sums of those, then one.
const (
	BlockThreads = 256
	MSEThreads   = 256 * BlockThreads
	SumThreads   = BlockThreads
)

// SourcesHash is the hash gen.sh writes into kernels.ptx's first line, of
// the CUDA sources in dir: the PTX is stale when it differs.
func SourcesHash(dir string) (string, error) {
	var list string
	for _, name := range []string{"kernels.h", "device.h"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		list += fmt.Sprintf("%x  %s\n", sha256.Sum256(b), name)
	}
	return fmt.Sprintf("%x", sha256.Sum256([]byte(list)))[:16], nil
}

// AdamWScalars are the adamw_f32 kernel's scalar arguments for step a,
// computed as the cpu provider computes them: decay = 1 − lr·wd, step =
// lr/(1 − β1^t), root = √(1 − β2^t), eps, w1 = 1 − β1, b2 = β2.
func AdamWScalars(a kernels.AdamWParams) [6]float32 {
	c1 := 1 - math.Pow(a.Beta1, float64(a.Step))
	c2 := 1 - math.Pow(a.Beta2, float64(a.Step))
	return [6]float32{float32(1 - a.LR*a.WeightDecay), float32(a.LR / c1), float32(math.Sqrt(c2)), float32(a.Eps), float32(1 - a.Beta1), float32(a.Beta2)}
}
