package ptx

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Launch shapes of the kernels. The sum of the
// mean squared error is reduced in a fixed order: MSEThreads partial sums
// (one per thread of a fixed grid), then stages of sum_stage, each thread
// adding SumFan of the last stage's (SumStages), down to one. (256 blocks
// and a one-block stage of 256 sums took 0.21 ms of the 4096-token MLP
// step on the H200: too few threads to keep the memory busy.)
// The bias gradient sums chunks of BiasChunk rows per column first;
// attention's softmax segments of SoftmaxSeg keys per row (attn_smax_part).
const (
	BlockThreads = 256
	MSEThreads   = 1 << 18
	SumFan       = 64
	BiasChunk    = 64
	SoftmaxSeg   = 32
)

// SumStages is the thread count of each stage of the fixed-order sum of n
// partial sums: n/SumFan while that divides evenly and leaves more than
// one, then 1 (MSEThreads: 4096, 64, 1).
func SumStages(n int) []int {
	var s []int
	for n > 1 {
		if n%SumFan == 0 && n > SumFan {
			n /= SumFan
		} else {
			n = 1
		}
		s = append(s, n)
	}
	return s
}

// EmbedPartBytes bounds the embedding gradient's scratch of chunk sums.
const EmbedPartBytes = 64 << 20

// EmbedChunks is how many chunks of tokens the embedding gradient of n
// tokens into a table (shard) of rows × d splits into, in stages (emb_part,
// emb_sum): one per 64 tokens at most, as many as EmbedPartBytes of double
// sums hold; 0 where fewer than two fit (one thread per column runs:
// embedding_grad). Each chunk's tokens: ceil(n / chunks).
func EmbedChunks(n, rows, d int) int {
	per := rows * d * 8
	if n < 2 || per <= 0 {
		return 0
	}
	k := min((n+63)/64, EmbedPartBytes/per)
	if k < 2 {
		return 0
	}
	return k
}

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

// Attn is the shape of an attention for the attn_* kernels: batch, heads,
// query and key rows, head dims, and the row widths of q, k and v (E, E, F;
// 3E each when packed, k and v then views of q at KOff and VOff elements).
type Attn struct {
	B, H, S, T, E, F int
	QS, KS, VS       int
	Packed           bool
	KOff, VOff       int
}

// The fused attention kernels (attn_flash_*): head dims up to FlashHeadDim
// (MR_FD), FlashQ query rows a forward block (MR_FQ), FlashRows rows a
// backward block and every staged tile (MR_FB).
const (
	FlashHeadDim = 64
	FlashQ       = 64
	FlashRows    = 32
)

// LayerNormThreads is the block of the layer norm's block kernels
// (ln_block, ln_dx_block: a block per row; MR_LNT).
const LayerNormThreads = 256

// Flash reports whether the fused kernels take the attention: head dims up
// to FlashHeadDim, and keys.
func (a Attn) Flash() bool { return a.E <= FlashHeadDim && a.F <= FlashHeadDim && a.T > 0 }

// FlashBlocks are the blocks of the fused forward, dq and dk-dv kernels.
func (a Attn) FlashBlocks() (fwd, dq, dkv int) {
	bh := a.B * a.H
	return bh * ((a.S + FlashQ - 1) / FlashQ), bh * ((a.S + FlashRows - 1) / FlashRows), bh * ((a.T + FlashRows - 1) / FlashRows)
}

// MaxHeadDim is the largest E and F the attention kernels take (their
// per-thread accumulators); larger heads go through the host.
const MaxHeadDim = 256

// AttnShape checks an attention's operands (kernels.AttentionDims) and
// returns its shape.
func AttnShape(o, lse, q, k, v *tensor.Tensor) (Attn, error) {
	b, h, s, t, e, f, err := kernels.AttentionDims(o, lse, q, k, v)
	if err != nil {
		return Attn{}, err
	}
	a := Attn{B: b, H: h, S: s, T: t, E: e, F: f, QS: e, KS: e, VS: f}
	if k == nil {
		a.QS, a.KS, a.VS, a.Packed, a.KOff, a.VOff = 3*e, 3*e, 3*e, true, e, 2*e
	}
	return a, nil
}

// Args are the kernels' shape arguments: B, H, S, T, E, F, qs, ks, vs.
func (a Attn) Args() []uint64 {
	return []uint64{uint64(a.B), uint64(a.H), uint64(a.S), uint64(a.T), uint64(a.E), uint64(a.F), uint64(a.QS), uint64(a.KS), uint64(a.VS)}
}
