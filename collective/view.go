package collective

import (
	"fmt"
	"slices"
)

// View returns the World as the ranks see it that ranks lists (world ranks;
// this rank among them): its rank is its index in ranks, its size
// len(ranks), and the ranks its methods take (Group, Communicator,
// LibraryGroup) are indices in ranks, which it translates to world ranks.
// Everything else is the World's: its failure, its state, its transport
// and control plane, its groups (a Group made through a view is the
// World's group of the translated ranks, its World the World). Close on a
// view does nothing: the World closes. A pipeline stage runs its model on
// a view of the stage's ranks, the model planned on a mesh of its own.
func (w *World) View(ranks []int) (*World, error) {
	root := w.root()
	global := w.global(ranks)
	me := slices.Index(global, root.rank)
	if me < 0 {
		return nil, fmt.Errorf("%w: rank %d is not in view %v", ErrInvalid, root.rank, global)
	}
	seen := map[int]bool{}
	for _, r := range global {
		if r < 0 || r >= root.size || seen[r] {
			return nil, fmt.Errorf("%w: view %v: bad or repeated rank %d (world %d)", ErrInvalid, global, r, root.size)
		}
		seen[r] = true
	}
	return &World{rank: me, size: len(global), t: root.t, ctrl: root.ctrl, opts: root.opts, job: root.job, log: root.log,
		ctx: root.ctx, parent: root, view: global}, nil
}

// root is the World a view looks at (w itself if it is none).
func (w *World) root() *World {
	if w.parent != nil {
		return w.parent
	}
	return w
}

// global translates ranks of the view to world ranks (ranks themselves on
// a World).
func (w *World) global(ranks []int) []int {
	if w.parent == nil {
		return ranks
	}
	out := make([]int, len(ranks))
	for i, r := range ranks {
		out[i] = -1
		if r >= 0 && r < len(w.view) {
			out[i] = w.view[r]
		}
	}
	return out
}
