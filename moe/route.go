package moe

import (
	"fmt"
	"math"
)

// routing is one forward's routing of this rank's tokens, on the host in
// float64: what the backward needs of the router and the dispatch.
type routing struct {
	t, e, k int
	probs   []float64 // [t, e]: the router's softmax
	expert  []int     // [t·k]: slot t·k+j's expert, in decreasing probability
	gate    []float64 // [t·k]: the chosen probabilities over their sum
	kept    []bool    // [t·k]: whether the expert kept the slot
	routed  []int     // [e]: this rank's slots routed to each expert
	psum    []float64 // [e]: Σ_t probs[t, e]
	// order lists the kept slots in send order: by expert, then slot.
	order []int
	// pos is each slot's row in the send buffer (-1: dropped).
	pos []int
	// count is, per expert, this rank's kept slots.
	count []int
}

// route computes the softmax, the top-k and the gates of logits [t, e]
// (ties to the lower expert). A logit that is NaN or infinite is an error
// naming the token (tok0 is this rank's first token).
func route(logits []float32, t, e, k, tok0 int) (*routing, error) {
	r := &routing{t: t, e: e, k: k, probs: make([]float64, t*e), expert: make([]int, t*k), gate: make([]float64, t*k),
		kept: make([]bool, t*k), routed: make([]int, e), psum: make([]float64, e), pos: make([]int, t*k), count: make([]int, e)}
	chosen := make([]bool, e)
	for i := range t {
		row, p := logits[i*e:(i+1)*e], r.probs[i*e:(i+1)*e]
		mx := math.Inf(-1)
		for j, v := range row {
			f := float64(v)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, fmt.Errorf("%w: token %d, expert %d: %v", ErrLogits, tok0+i, j, v)
			}
			mx = max(mx, f)
		}
		var sum float64
		for j, v := range row {
			p[j] = math.Exp(float64(v) - mx)
			sum += p[j]
		}
		for j := range p {
			p[j] /= sum
			r.psum[j] += p[j]
		}
		clear(chosen)
		var gs float64
		for j := range k {
			best := -1
			for c, v := range p {
				if !chosen[c] && (best < 0 || v > p[best]) {
					best = c
				}
			}
			chosen[best] = true
			r.expert[i*k+j] = best
			gs += p[best]
			r.routed[best]++
		}
		for j := range k {
			r.gate[i*k+j] = p[r.expert[i*k+j]] / gs
		}
	}
	return r, nil
}

// keep decides which slots their experts keep: with capacity c > 0, expert
// x keeps the slots numbered below c in global slot order, where before[x]
// of its slots come from tokens before this rank's. It then lays out the
// send buffer.
func (r *routing) keep(c int, before []int) {
	seen := make([]int, r.e)
	for s, x := range r.expert {
		r.kept[s] = c == 0 || before[x]+seen[x] < c
		seen[x]++
		if r.kept[s] {
			r.count[x]++
		}
	}
	start := make([]int, r.e+1)
	for x := range r.e {
		start[x+1] = start[x] + r.count[x]
	}
	r.order = make([]int, start[r.e])
	for s, x := range r.expert {
		r.pos[s] = -1
		if r.kept[s] {
			r.pos[s] = start[x]
			r.order[start[x]] = s
			start[x]++
		}
	}
}

// gradLogits is the gradient of the objective with respect to this rank's
// logits [t, e], given the gates' gradients dgate [t·k] and the aux loss's
// gradient with respect to each probability, daux[e] (coef·E·f_e/T).
func (r *routing) gradLogits(dgate, daux []float64, out []float32) {
	dp := make([]float64, r.e)
	for i := range r.t {
		p := r.probs[i*r.e : (i+1)*r.e]
		copy(dp, daux)
		var gs, dot float64
		for j := range r.k {
			gs += p[r.expert[i*r.k+j]]
			dot += dgate[i*r.k+j] * r.gate[i*r.k+j]
		}
		// gate_j = p_j / Σ p: ∂/∂p_j = (dgate_j - Σ_i dgate_i·gate_i) / Σ p.
		for j := range r.k {
			dp[r.expert[i*r.k+j]] += (dgate[i*r.k+j] - dot) / gs
		}
		var s float64
		for j, v := range p {
			s += v * dp[j]
		}
		for j, v := range p {
			out[i*r.e+j] = float32(v * (dp[j] - s))
		}
	}
}
