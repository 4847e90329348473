//go:build cudaemu

package ptx

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// TestBlockKernelsInAnyOrder: the block kernels (the fused attention's,
// the layer norm's a block per row) give the same bits whether a block's
// threads run free or take turns between barriers in ascending or in
// descending order: no thread reads shared memory another writes without a
// barrier between them (a GPU's warps run in no set order). A kernel with
// a barrier taken out fails it.
func TestBlockKernelsInAnyOrder(t *testing.T) {
	defer SetOrder(OrderFree)
	rng := rand.New(rand.NewSource(9))
	st := kernels.StatsDType(tensor.BFloat16)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		for _, sz := range []attnSize{{1, 1, 70, 70, 0, 0}, {1, 1, 40, 40, 64, 64}} {
			q := randn(rng, dt, 1, sz.b, sz.s, sz.h, 3, max(sz.e, 4))
			do := randn(rng, dt, 1, sz.b, sz.s, sz.h, max(sz.e, 4))
			run := func() [][]byte {
				o, lse := tensor.New(dt, sz.b, sz.s, sz.h, max(sz.e, 4)), tensor.New(st, sz.b, sz.h, sz.s)
				if err := FlashAttention(o, lse, q, nil, nil, true, 1); err != nil {
					t.Fatal(err)
				}
				dq := tensor.New(dt, q.Shape()...)
				if err := FlashAttentionBackward(dq, nil, nil, do, q, nil, nil, o, lse, true, 3); err != nil {
					t.Fatal(err)
				}
				return [][]byte{tensor.HostBytes(o), tensor.HostBytes(lse), tensor.HostBytes(dq)}
			}
			inOrders(t, fmt.Sprintf("attention %v %+v", dt, sz), run)
		}
		rows, d := 3, 700
		x, gamma, beta, dy := randn(rng, dt, 2, rows, d), randn(rng, dt, 1, d), randn(rng, dt, 1, d), randn(rng, dt, 1, rows, d)
		inOrders(t, fmt.Sprintf("layer norm %v", dt), func() [][]byte {
			y, stats, dx := tensor.New(dt, rows, d), tensor.New(st, rows, 2), tensor.New(dt, rows, d)
			LayerNormBlock(y, stats, x, gamma, beta, rows, d, 1e-5)
			LayerNormDXBlock(dx, dy, x, gamma, stats, rows, d)
			return [][]byte{tensor.HostBytes(y), tensor.HostBytes(stats), tensor.HostBytes(dx)}
		})
	}
}

// inOrders runs run with the threads free, then in turns ascending and
// descending, and wants the same bytes from each.
func inOrders(t *testing.T, name string, run func() [][]byte) {
	t.Helper()
	SetOrder(OrderFree)
	want := run()
	for _, order := range []int{OrderAscending, OrderDescending} {
		SetOrder(order)
		got := run()
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("%s: output %d differs with the threads in order %d", name, i, order)
			}
		}
	}
	SetOrder(OrderFree)
}
