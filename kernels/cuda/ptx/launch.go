package ptx

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
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
