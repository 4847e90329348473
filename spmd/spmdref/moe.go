package spmdref

import (
	"errors"
	"fmt"
	"math"
	"slices"

	sim "github.com/meshrun/meshrun/placement/placementref"
)

// The mixture-of-experts layer of docs/moe.md, in float64: the reference the
// distributed layer and its verify workload are checked against, and that
// TestMoEMatchesPyTorch checks against PyTorch's autograd.

// Sentinel errors of the mixture-of-experts reference; test with errors.Is.
var (
	// ErrMoEShape: operands whose shapes do not fit one layer (x [T, H],
	// router [E, H], w1 [E, F, H], b1 [E, F], w2 [E, H, F], b2 [E, H], dy
	// [T, H]), or whose data does not fill their shape.
	ErrMoEShape = errors.New("spmdref: mixture-of-experts shapes do not fit")
	// ErrMoERouting: no expert (E = 0), k outside 1..E, or a capacity factor
	// that is negative or not finite.
	ErrMoERouting = errors.New("spmdref: bad mixture-of-experts routing")
	// ErrMoELogits: a router logit that is NaN or infinite, for which the
	// softmax and the top-k choice mean nothing.
	ErrMoELogits = errors.New("spmdref: router logits not finite")
)

// MoE is how a mixture-of-experts layer routes its tokens.
type MoE struct {
	// K is how many experts each token goes to (1..E).
	K int
	// Capacity is the capacity factor c: each expert keeps the first
	// ceil(T·k·c / E) slots routed to it, in slot order, and drops the rest.
	// 0 is dropless.
	Capacity float64
}

// MoEParams are a layer's parameters: Router [E, H], W1 [E, F, H], B1
// [E, F], W2 [E, H, F], B2 [E, H].
type MoEParams struct {
	Router, W1, B1, W2, B2 sim.Tensor
}

// MoEOut is the forward's result. Slots are numbered t·k + j: token t's j-th
// choice.
type MoEOut struct {
	Y   sim.Tensor // [T, H]
	Aux float64    // the load-balancing loss E·Σ f_e·P_e
	// Probs [T, E] is the router's softmax.
	Probs sim.Tensor
	// Expert, Gate and Kept are per slot: the chosen expert (in decreasing
	// probability, ties to the lower index), its gate (the chosen
	// probabilities renormalized over the token's k choices), and whether
	// the expert kept the slot (false: dropped at capacity).
	Expert []int
	Gate   []float64
	Kept   []bool
	// Routed and Tokens are per expert: the slots routed to it, and the ones
	// it kept (what it computes).
	Routed, Tokens []int
	// Dropped counts the slots dropped at capacity.
	Dropped int
	// Cap is the capacity per expert; 0 when dropless.
	Cap int
}

// MoEGrads are the gradients of Σ dy⊙y + auxCoef·aux, shaped as their
// operands.
type MoEGrads struct {
	DX, DRouter, DW1, DB1, DW2, DB2 sim.Tensor
}

// moeDims are the sizes of one layer's operands.
type moeDims struct{ T, H, E, F int }

// check validates the routing and the operands' shapes and returns the sizes.
func (m MoE) check(x sim.Tensor, p MoEParams) (moeDims, error) {
	if len(x.Shape) != 2 || len(p.Router.Shape) != 2 {
		return moeDims{}, fmt.Errorf("%w: x %v and router %v, want [T, H] and [E, H]", ErrMoEShape, x.Shape, p.Router.Shape)
	}
	d := moeDims{T: x.Shape[0], H: x.Shape[1], E: p.Router.Shape[0]}
	if len(p.W1.Shape) == 3 {
		d.F = p.W1.Shape[1]
	}
	if d.E == 0 {
		return d, fmt.Errorf("%w: no expert (router %v)", ErrMoERouting, p.Router.Shape)
	}
	if m.K < 1 || m.K > d.E {
		return d, fmt.Errorf("%w: k = %d, want 1..E = 1..%d", ErrMoERouting, m.K, d.E)
	}
	if m.Capacity < 0 || math.IsNaN(m.Capacity) || math.IsInf(m.Capacity, 0) {
		return d, fmt.Errorf("%w: capacity factor %g, want 0 (dropless) or a positive number", ErrMoERouting, m.Capacity)
	}
	for _, o := range []struct {
		name string
		t    sim.Tensor
		want []int
	}{
		{"x", x, []int{d.T, d.H}},
		{"router", p.Router, []int{d.E, d.H}},
		{"w1", p.W1, []int{d.E, d.F, d.H}},
		{"b1", p.B1, []int{d.E, d.F}},
		{"w2", p.W2, []int{d.E, d.H, d.F}},
		{"b2", p.B2, []int{d.E, d.H}},
	} {
		if err := fits(o.name, o.t, o.want); err != nil {
			return d, err
		}
	}
	return d, nil
}

// fits checks that t has shape want and as many values.
func fits(name string, t sim.Tensor, want []int) error {
	n := 1
	for _, s := range want {
		n *= s
	}
	if !slices.Equal(t.Shape, want) || len(t.Data) != n {
		return fmt.Errorf("%w: %s has shape %v (%d values), want %v", ErrMoEShape, name, t.Shape, len(t.Data), want)
	}
	return nil
}

// MoEForward runs the layer on x [T, H]: y, the load-balancing loss, and the
// routing (which slots went where, which were dropped).
func MoEForward(m MoE, x sim.Tensor, p MoEParams) (MoEOut, error) {
	d, err := m.check(x, p)
	if err != nil {
		return MoEOut{}, err
	}
	o, err := m.route(d, x, p.Router)
	if err != nil {
		return MoEOut{}, err
	}
	o.Y = sim.New(d.T, d.H)
	h := make([]float64, d.F)
	for s, e := range o.Expert {
		if !o.Kept[s] {
			continue
		}
		t := s / m.K
		out := expert(d, p, e, x.Data[t*d.H:(t+1)*d.H], h)
		for i, v := range out {
			o.Y.Data[t*d.H+i] += o.Gate[s] * v
		}
	}
	return o, nil
}

// route computes the router's softmax, each token's top-k and gates, the
// capacity's drops and the load-balancing loss.
func (m MoE) route(d moeDims, x, router sim.Tensor) (MoEOut, error) {
	k := m.K
	o := MoEOut{
		Probs:  sim.New(d.T, d.E),
		Expert: make([]int, d.T*k), Gate: make([]float64, d.T*k), Kept: make([]bool, d.T*k),
		Routed: make([]int, d.E), Tokens: make([]int, d.E),
	}
	logit := make([]float64, d.E)
	order := make([]int, d.E)
	for t := 0; t < d.T; t++ {
		xt := x.Data[t*d.H : (t+1)*d.H]
		top := math.Inf(-1)
		for e := range logit {
			logit[e] = dot(xt, router.Data[e*d.H:(e+1)*d.H])
			if math.IsNaN(logit[e]) || math.IsInf(logit[e], 0) {
				return MoEOut{}, fmt.Errorf("%w: token %d, expert %d: %g", ErrMoELogits, t, e, logit[e])
			}
			top = max(top, logit[e])
		}
		pt := o.Probs.Data[t*d.E : (t+1)*d.E]
		var z float64
		for e, l := range logit {
			pt[e] = math.Exp(l - top)
			z += pt[e]
		}
		for e := range pt {
			pt[e] /= z
		}
		// The k largest probabilities, ties to the lower index: a stable
		// sort of the experts by decreasing probability.
		for e := range order {
			order[e] = e
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case pt[a] > pt[b]:
				return -1
			case pt[a] < pt[b]:
				return 1
			}
			return 0
		})
		var sum float64
		for j := 0; j < k; j++ {
			sum += pt[order[j]]
		}
		for j := 0; j < k; j++ {
			s := t*k + j
			o.Expert[s] = order[j]
			o.Gate[s] = pt[order[j]] / sum
			o.Routed[order[j]]++
		}
	}
	// Capacity: each expert keeps its first Cap slots in slot order.
	if m.Capacity > 0 {
		o.Cap = int(math.Ceil(float64(d.T*k) * m.Capacity / float64(d.E)))
	}
	for s, e := range o.Expert {
		if o.Cap == 0 || o.Tokens[e] < o.Cap {
			o.Kept[s] = true
			o.Tokens[e]++
		} else {
			o.Dropped++
		}
	}
	// aux = E·Σ f_e·P_e: f_e the share of the T·k routed slots that go to
	// e, P_e the mean probability of e over the tokens (0 for no token).
	if d.T > 0 {
		for e := 0; e < d.E; e++ {
			var pe float64
			for t := 0; t < d.T; t++ {
				pe += o.Probs.Data[t*d.E+e]
			}
			o.Aux += float64(o.Routed[e]) / float64(d.T*k) * pe / float64(d.T)
		}
		o.Aux *= float64(d.E)
	}
	return o, nil
}

// expert computes expert e on one token xt: W2_e·gelu(W1_e·xt + b1_e) +
// b2_e. h (F values) receives the pre-activation.
func expert(d moeDims, p MoEParams, e int, xt, h []float64) []float64 {
	w1 := p.W1.Data[e*d.F*d.H : (e+1)*d.F*d.H]
	w2 := p.W2.Data[e*d.H*d.F : (e+1)*d.H*d.F]
	a := make([]float64, d.F)
	for f := 0; f < d.F; f++ {
		h[f] = dot(w1[f*d.H:(f+1)*d.H], xt) + p.B1.Data[e*d.F+f]
		a[f] = UnaryF("gelu", h[f])
	}
	out := make([]float64, d.H)
	for i := 0; i < d.H; i++ {
		out[i] = dot(w2[i*d.F:(i+1)*d.F], a) + p.B2.Data[e*d.H+i]
	}
	return out
}

// dot is Σ a_i·b_i, in index order.
func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// MoEBackward computes the gradients of Σ dy⊙y + auxCoef·aux with respect
// to x and every parameter, dy [T, H]. The routing (top-k choice, capacity
// drops, the counts f_e) is held fixed: gradients flow through the gates
// into the router's softmax and the router, through the kept slots' experts,
// and from aux into the mean probabilities P_e only.
func MoEBackward(m MoE, x sim.Tensor, p MoEParams, dy sim.Tensor, auxCoef float64) (MoEGrads, error) {
	d, err := m.check(x, p)
	if err != nil {
		return MoEGrads{}, err
	}
	if err := fits("dy", dy, []int{d.T, d.H}); err != nil {
		return MoEGrads{}, err
	}
	o, err := m.route(d, x, p.Router)
	if err != nil {
		return MoEGrads{}, err
	}
	g := MoEGrads{
		DX: sim.New(d.T, d.H), DRouter: sim.New(d.E, d.H),
		DW1: sim.New(d.E, d.F, d.H), DB1: sim.New(d.E, d.F),
		DW2: sim.New(d.E, d.H, d.F), DB2: sim.New(d.E, d.H),
	}
	k := m.K
	h, dh := make([]float64, d.F), make([]float64, d.F)
	dgate := make([]float64, k)
	dp := make([]float64, d.E)
	for t := 0; t < d.T; t++ {
		xt := x.Data[t*d.H : (t+1)*d.H]
		dyt := dy.Data[t*d.H : (t+1)*d.H]
		dxt := g.DX.Data[t*d.H : (t+1)*d.H]
		// The experts of the kept slots: dL/dgate = dy·expert(x), and the
		// expert's output gradient is gate·dy.
		for j := 0; j < k; j++ {
			s := t*k + j
			dgate[j] = 0
			if !o.Kept[s] {
				continue
			}
			e := o.Expert[s]
			out := expert(d, p, e, xt, h)
			dgate[j] = dot(dyt, out)
			w1 := p.W1.Data[e*d.F*d.H : (e+1)*d.F*d.H]
			w2 := p.W2.Data[e*d.H*d.F : (e+1)*d.H*d.F]
			dw1 := g.DW1.Data[e*d.F*d.H : (e+1)*d.F*d.H]
			dw2 := g.DW2.Data[e*d.H*d.F : (e+1)*d.H*d.F]
			clear(dh)
			for i := 0; i < d.H; i++ {
				do := o.Gate[s] * dyt[i]
				g.DB2.Data[e*d.H+i] += do
				for f := 0; f < d.F; f++ {
					dw2[i*d.F+f] += do * UnaryF("gelu", h[f])
					dh[f] += do * w2[i*d.F+f]
				}
			}
			for f := 0; f < d.F; f++ {
				dh[f] *= UnaryGrad("gelu", h[f])
				g.DB1.Data[e*d.F+f] += dh[f]
				for i := 0; i < d.H; i++ {
					dw1[f*d.H+i] += dh[f] * xt[i]
					dxt[i] += dh[f] * w1[f*d.H+i]
				}
			}
		}
		// Gates g_j = p_j / Σ_i p_i over the chosen i: dp_j = (dg_j −
		// Σ_i dg_i·g_i) / Σ_i p_i. A dropped slot's dg is 0, but its p is in
		// the sum, so it still gets a gradient.
		pt := o.Probs.Data[t*d.E : (t+1)*d.E]
		var sum, mix float64
		for j := 0; j < k; j++ {
			sum += pt[o.Expert[t*k+j]]
			mix += dgate[j] * o.Gate[t*k+j]
		}
		// aux: dP_e/dp_te = 1/T, times E·f_e·auxCoef.
		for e := range dp {
			dp[e] = auxCoef * float64(d.E) * float64(o.Routed[e]) / float64(d.T*k) / float64(d.T)
		}
		for j := 0; j < k; j++ {
			dp[o.Expert[t*k+j]] += (dgate[j] - mix) / sum
		}
		// Softmax: dlogit = p ⊙ (dp − Σ dp⊙p); logit_e = x·router_e.
		back := dot(dp, pt)
		for e := 0; e < d.E; e++ {
			dl := pt[e] * (dp[e] - back)
			re := p.Router.Data[e*d.H : (e+1)*d.H]
			dr := g.DRouter.Data[e*d.H : (e+1)*d.H]
			for i := 0; i < d.H; i++ {
				dr[i] += dl * xt[i]
				dxt[i] += dl * re[i]
			}
		}
	}
	return g, nil
}
