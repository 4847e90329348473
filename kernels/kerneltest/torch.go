package kerneltest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"sync"
)

// torchJSON is testdata/torch_ref.json, written by testdata/torch_ref.py
// (PyTorch; that script says how to regenerate it).
//
//go:embed testdata/torch_ref.json
var torchJSON []byte

// TorchRef holds PyTorch's values for ops whose Go references would
// otherwise be checked only against themselves or against other Go code
// written from the same formulas: each op's inputs and what PyTorch computed
// from them (float64 and autograd; AdamW on float32), flattened row-major.
type TorchRef struct {
	Generator string `json:"generator"` // the script that wrote them
	Torch     string `json:"torch"`     // its PyTorch version
	// Gelu: gelu(x, approximate="tanh") and its derivative, at points exact
	// in bfloat16 (a provider of any dtype runs at exactly these x).
	Gelu struct {
		X    []float64 `json:"x"`
		Y    []float64 `json:"y"`
		DYDX []float64 `json:"dydx"`
	} `json:"gelu"`
	// LayerNorm: F.layer_norm over the last dim of x[Shape] with Eps, and
	// the gradients of Σ y·dy.
	LayerNorm struct {
		Eps    float64   `json:"eps"`
		Shape  []int     `json:"shape"`
		X      []float64 `json:"x"`
		Gamma  []float64 `json:"gamma"`
		Beta   []float64 `json:"beta"`
		DY     []float64 `json:"dy"`
		Y      []float64 `json:"y"`
		DX     []float64 `json:"dx"`
		DGamma []float64 `json:"dgamma"`
		DBeta  []float64 `json:"dbeta"`
	} `json:"layer_norm"`
	// Attention: causal attention of q, k, v [B, S, H, E] (Shape, meshrun's
	// layout), and the gradients of Σ o·do.
	Attention struct {
		Shape []int     `json:"shape"`
		Q     []float64 `json:"q"`
		K     []float64 `json:"k"`
		V     []float64 `json:"v"`
		DO    []float64 `json:"do"`
		O     []float64 `json:"o"`
		DQ    []float64 `json:"dq"`
		DK    []float64 `json:"dk"`
		DV    []float64 `json:"dv"`
	} `json:"attention"`
	// CrossEntropy: each row's loss for logits [Rows, Vocab] and targets, and
	// the gradient of the mean loss.
	CrossEntropy struct {
		Rows        int       `json:"rows"`
		Vocab       int       `json:"vocab"`
		Logits      []float64 `json:"logits"`
		Targets     []int     `json:"targets"`
		Loss        []float64 `json:"loss"`
		DLogitsMean []float64 `json:"dlogits_mean"`
	} `json:"cross_entropy"`
	// AdamW: torch.optim.AdamW on float32 Param, one step per row of Grads;
	// After holds the parameters after each step.
	AdamW struct {
		LR          float64     `json:"lr"`
		Beta1       float64     `json:"beta1"`
		Beta2       float64     `json:"beta2"`
		Eps         float64     `json:"eps"`
		WeightDecay float64     `json:"weight_decay"`
		Param       []float64   `json:"param"`
		Grads       [][]float64 `json:"grads"`
		After       [][]float64 `json:"after"`
	} `json:"adamw"`
}

var torchRef = sync.OnceValues(func() (*TorchRef, error) {
	var r TorchRef
	dec := json.NewDecoder(bytes.NewReader(torchJSON))
	dec.DisallowUnknownFields()
	return &r, dec.Decode(&r)
})

// Torch returns PyTorch's values (testdata/torch_ref.json). The file is
// embedded, so it cannot be missing; a malformed one panics.
func Torch() *TorchRef {
	r, err := torchRef()
	if err != nil {
		panic("kerneltest: testdata/torch_ref.json: " + err.Error())
	}
	return r
}
