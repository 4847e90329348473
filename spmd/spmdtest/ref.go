package spmdtest

import "github.com/meshrun/meshrun/spmd/spmdref"

// The reference implementations are package spmdref (the verify workload
// links them; test support is not linked into production code). These
// forward to them for the tests that still name them here, until those
// tests import spmdref.

// LayerNormEps is spmdref.LayerNormEps.
//
// Deprecated: use spmdref.LayerNormEps.
const LayerNormEps = spmdref.LayerNormEps

// Eval is spmdref.Eval.
//
// Deprecated: use spmdref.Eval.
var Eval = spmdref.Eval

// EvalAt is spmdref.EvalAt.
//
// Deprecated: use spmdref.EvalAt.
var EvalAt = spmdref.EvalAt
