package models

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/tensor"
)

// The context-parallel GPT (a mesh cp=C or cp=C,tp=N): every sequence of
// the batch is split over cp in the zigzag layout (ring.Zigzag: cp rank r
// holds the chunks r and 2·cp−1−r of 2·cp), so each rank holds, for each of
// the Batch sequences, the positions ring.Positions of its chunks in that
// order: Batch·Context/cp token rows. The permutation is applied once, when
// a step takes its batch (token ids, target ids, and the position ids of
// the position embedding); every op but attention works token by token and
// does not see the order. The linear layers split their tokens over cp as
// the mixture-of-experts GPT splits them over ep (2-D presets; each layer
// reduces its parameters' gradients over cp itself). Attention unpacks the
// rank's q, k and v to the host and runs ring attention over the cp group:
// keys and values go around the ring, queries stay. Every parameter is
// replicated over cp: the embeddings' and layer norms' gradients are summed
// over cp in one all-reduce, and the loss is normalized over the whole
// batch.

// cpRank is this rank's coordinate along cp (0 without cp).
func (g *GPT) cpRank() int {
	if g.Cfg.CP() == 1 {
		return 0
	}
	return g.Cfg.Mesh.Coords(g.rank)[g.Cfg.dimOf("cp")]
}

// batchRank is this rank's coordinate along the dim that splits the batch
// (ep or dp; 0 without either).
func (g *GPT) batchRank() int {
	c := g.Cfg
	for _, name := range []string{"ep", "dp"} {
		if i := c.dimOf(name); i >= 0 && c.Mesh.NDim() > 1 {
			return c.Mesh.Coords(g.rank)[i]
		}
	}
	return 0
}

// cpChunks is every cp rank's chunks of a sequence (one chunk, the whole
// sequence, without cp).
func (c GPTConfig) cpChunks() [][]ring.Chunk {
	if c.CP() == 1 {
		return [][]ring.Chunk{{{Index: 0, Start: 0, Len: c.Context}}}
	}
	chunks, err := ring.Chunks(c.Context, c.CP(), ring.Zigzag)
	if err != nil {
		panic(err) // checked: the context is a multiple of 2·cp
	}
	return chunks
}

// cpPositions is the positions of each sequence this rank holds, in its
// order: 0 … Context−1 without cp.
func (g *GPT) cpPositions() []int { return ring.Positions(g.Cfg.cpChunks()[g.cpRank()]) }

// cpOwner is the cp rank that holds position pos of a sequence and the
// position's index among that rank's.
func (c GPTConfig) cpOwner(pos int) (owner, index int) {
	for r, chunks := range c.cpChunks() {
		at := 0
		for _, ch := range chunks {
			if pos >= ch.Start && pos < ch.Start+ch.Len {
				return r, at + pos - ch.Start
			}
			at += ch.Len
		}
	}
	return 0, pos
}

// cpRows copies this rank's positions of each of its dp coordinate's
// sequences of the batch's token vector t ([Batch·Context], the sequences
// one after the other) into scratch name: [Batch/dp·Context/cp], each
// sequence's positions in the rank's order. One 2-D copy per chunk.
func (g *GPT) cpRows(rt linear.Runtime, name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	c := g.Cfg
	if t.Len() != c.Tokens() {
		return nil, fmt.Errorf("%w: gpt: %d token ids, want batch × context = %d", linear.ErrConfig, t.Len(), c.Tokens())
	}
	sl := c.localContext()
	lb := c.localBatch()
	out, err := g.get(rt, name, lb*sl)
	if err != nil {
		return nil, err
	}
	first := g.batchRank() * lb * c.Context
	at := 0
	for _, ch := range c.cpChunks()[g.cpRank()] {
		if err := rt.Kernels.Copy2D(out, 4*at, 4*sl, t, 4*(first+ch.Start), 4*c.Context, 4*ch.Len, lb); err != nil {
			return nil, err
		}
		at += ch.Len
	}
	return out, nil
}

// ringFor returns block b's ring attention, built on first use over the
// rank's cp group.
func (g *GPT) ringFor(ctx context.Context, rt linear.Runtime, b *gptBlock) (*ring.Attention, error) {
	if b.ring != nil {
		return b.ring, nil
	}
	c := g.Cfg
	if g.cpGroup == nil {
		grp, err := redistribute.MeshGroup(ctx, rt.World, c.Mesh, c.dimOf("cp"))
		if err != nil {
			return nil, fmt.Errorf("gpt: the cp group: %w", err)
		}
		g.cpGroup = grp
	}
	var k kernels.Kernels = rt.Kernels
	if c.RingKernels != nil {
		k = c.RingKernels
	}
	hl, hd := c.Heads/c.TP(), c.Dim/c.Heads
	if g.CPAttention == "" {
		// Run what the planner chose for the block's attention: the ring,
		// or (short contexts) the keys and values gathered.
		t, err := layout.NewTransformerWith(ctx, c.Planner, c.Mesh, c.Tokens(), c.Context, c.Heads, c.Dim, 4*c.Dim, false)
		if err != nil {
			return nil, fmt.Errorf("gpt: planning attention over cp: %w", err)
		}
		g.CPAttention = "gather"
		for _, op := range t.Ops {
			if op.Name == "attention" && op.Fwd.Ring != nil {
				g.CPAttention = "ring"
			}
		}
	}
	a, err := ring.New(ring.Config{Group: g.cpGroup, Kernels: k, Causal: true, Layout: ring.Zigzag,
		S: c.Context, B: c.localBatch(), H: hl, E: hd, F: hd, Rank: g.cpRank(), Size: c.CP(), Gather: g.CPAttention == "gather"})
	if err != nil {
		return nil, fmt.Errorf("gpt: ring attention: %w", err)
	}
	b.ring = a
	return a, nil
}

// toHost downloads t as a float32 host tensor.
func toHost(t *tensor.Tensor) (*tensor.Tensor, error) {
	h, err := tensor.Download(t)
	if err != nil {
		return nil, err
	}
	return tensor.Convert(h, tensor.Float32)
}

// fromHost writes the float32 host tensor h into t (of t's dtype, on its
// device).
func fromHost(t, h *tensor.Tensor) error {
	c, err := tensor.Convert(h, t.DType())
	if err != nil {
		return err
	}
	return tensor.MemoryOf(t).Write(t, 0, tensor.HostBytes(c), tensor.Transfer)
}

// ringForward runs block b's attention under cp: this rank's packed qkv
// [B, Sl, H, 3, E] is split into q, k and v on the host, ring attention
// runs over the cp group, and its output is written into o [B, Sl, H, E].
func (g *GPT) ringForward(ctx context.Context, rt linear.Runtime, b *gptBlock, qkv, o *tensor.Tensor) error {
	a, err := g.ringFor(ctx, rt, b)
	if err != nil {
		return err
	}
	packed, err := toHost(qkv)
	if err != nil {
		return err
	}
	bs, sl, h, e := qkv.Dim(0), qkv.Dim(1), qkv.Dim(2), qkv.Dim(4)
	var parts [3]*tensor.Tensor
	src := packed.Float32()
	for j := range parts {
		parts[j] = tensor.New(tensor.Float32, bs, sl, h, e)
		dst := parts[j].Float32()
		for r := range bs * sl * h {
			copy(dst[r*e:(r+1)*e], src[(3*r+j)*e:(3*r+j+1)*e])
		}
	}
	var out *tensor.Tensor
	err = rt.Op("ring_attention", func() error {
		var err error
		out, _, err = a.Forward(ctx, parts[0], parts[1], parts[2])
		return err
	})
	if err != nil {
		return err
	}
	return fromHost(o, out)
}

// ringBackward writes into dqkv [B, Sl, H, 3, E] the gradient of block b's
// packed qkv from do [B, Sl, H, E], the gradient of its attention's output.
func (g *GPT) ringBackward(ctx context.Context, rt linear.Runtime, b *gptBlock, dqkv, do *tensor.Tensor) error {
	hdo, err := toHost(do)
	if err != nil {
		return err
	}
	var dq, dk, dv *tensor.Tensor
	err = rt.Op("ring_attention_backward", func() error {
		var err error
		dq, dk, dv, err = b.ring.Backward(ctx, hdo)
		return err
	})
	if err != nil {
		return err
	}
	bs, sl, h, e := dqkv.Dim(0), dqkv.Dim(1), dqkv.Dim(2), dqkv.Dim(4)
	packed := tensor.New(tensor.Float32, bs, sl, h, 3, e)
	dst := packed.Float32()
	for j, part := range []*tensor.Tensor{dq, dk, dv} {
		src := part.Float32()
		for r := range bs * sl * h {
			copy(dst[(3*r+j)*e:(3*r+j+1)*e], src[r*e:(r+1)*e])
		}
	}
	return fromHost(dqkv, packed)
}

// sumOverSplit sums a host number over the ranks of this rank's group
// along the dims before tp (ep, or dp and cp).
func (g *GPT) sumOverSplit(ctx context.Context, rt linear.Runtime, x float64) (float64, error) {
	grp, err := rt.World.Group(ctx, g.splitGroup())
	if err != nil {
		return 0, err
	}
	buf := []float64{x}
	if err := collective.AllReduce(ctx, grp, buf, collective.Sum); err != nil {
		return 0, fmt.Errorf("gpt: loss over %s: %w", g.Cfg.splitName(), err)
	}
	return buf[0], nil
}

// RingBytes is the bytes this rank sent around the cp ring in the last
// step's attention (every block's keys and values forward, and with their
// gradients backward); 0 without cp.
func (g *GPT) RingBytes() int64 {
	var n int64
	for _, b := range g.blocks {
		if b.ring != nil {
			n += b.ring.Sent()
		}
	}
	return n
}
