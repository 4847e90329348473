package tensor

import "strconv"

// ReduceOp is an element-wise reduction of tensors: the pending reduction of
// a partial tensor (package placement) and the one a collective applies
// (package collective). It is defined here, below both, so that the two share
// one type without either importing the other.
type ReduceOp uint8

// The reductions.
const (
	Sum ReduceOp = iota
	Avg
	Max
	Min
)

var reduceNames = [...]string{Sum: "sum", Avg: "avg", Max: "max", Min: "min"}

func (op ReduceOp) String() string {
	if int(op) < len(reduceNames) {
		return reduceNames[op]
	}
	return "op(" + strconv.Itoa(int(op)) + ")"
}
