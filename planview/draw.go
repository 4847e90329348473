package planview

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
)

// Drawing a plan (`launcher plan --draw`): each tensor of an op as the grid
// of the blocks the ranks hold, and each collective as what moves from
// which ranks' blocks to which.
//
// A tensor is drawn in its 2-D view: rows its dim 0, columns its other dims
// (a vector is one row). A block is a box some ranks hold (replicas hold
// the same box), labelled with those ranks and its shape, drawn at its true
// size along each axis (uneven shards look uneven); a Partial layout is
// noted as partial sums, each rank's box the whole tensor. In text, blocks
// are coloured by their first rank when colour is on.

// drawn is one tensor to draw: its name, a note (given, moved to ...) and
// its layout.
type drawn struct {
	name, note string
	spec       placement.Spec
}

// block is a box of a tensor and the ranks that hold it.
type block struct {
	off, shape []int
	ranks      []int
}

// blocksOf lists spec's boxes, each with its ranks in order, sorted by offset.
func blocksOf(spec placement.Spec) []block {
	var bs []block
	for r := range spec.Mesh.Size() {
		shape, off := spec.Local(r)
		i := slices.IndexFunc(bs, func(b block) bool { return slices.Equal(b.off, off) && slices.Equal(b.shape, shape) })
		if i < 0 {
			bs = append(bs, block{off: off, shape: shape})
			i = len(bs) - 1
		}
		bs[i].ranks = append(bs[i].ranks, r)
	}
	slices.SortFunc(bs, func(a, b block) int { return slices.Compare(a.off, b.off) })
	return bs
}

// partial reports whether spec holds partial sums on some mesh dim.
func partial(spec placement.Spec) bool {
	return slices.ContainsFunc(spec.Placements, func(p placement.Placement) bool { _, ok := p.(placement.Partial); return ok })
}

// ranksText is "0,1", or "0+1" for partial sums.
func ranksText(rs []int, sum bool) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r)
	}
	sep := ","
	if sum {
		sep = "+"
	}
	return strings.Join(s, sep)
}

// blocksText is spec's blocks in a line: "[0|1]" (two blocks, rank 0's and
// rank 1's), "[0,1]" (one block both hold), "[0+1]" (partial sums both hold),
// rows of a matrix's 2-D split separated by "/": "[0|1/2|3]".
func blocksText(spec placement.Spec) string {
	bs := blocksOf(spec)
	var b strings.Builder
	b.WriteByte('[')
	for i, x := range bs {
		if i > 0 {
			if len(x.off) > 1 && x.off[0] != bs[i-1].off[0] {
				b.WriteByte('/')
			} else {
				b.WriteByte('|')
			}
		}
		b.WriteString(ranksText(x.ranks, partial(spec)))
	}
	b.WriteByte(']')
	return b.String()
}

// collectiveText is one collective as what moves: "w all_gather over tp:
// [0|1] -> [0,1]".
func collectiveText(c spmd.Collective) string {
	var dims []string
	for _, d := range c.Step.MeshDims {
		dims = append(dims, c.Step.From.Mesh.DimName(d))
	}
	if c.Ring != nil {
		return fmt.Sprintf("%s %s over %s: %s, each rank's block to the next rank, %d steps", c.Tensor, c.Kind(), strings.Join(dims, ","),
			blocksText(c.Ring.Spec), c.Ring.Steps)
	}
	return fmt.Sprintf("%s %s over %s: %s -> %s", c.Tensor, c.Kind(), strings.Join(dims, ","), blocksText(c.Step.From), blocksText(c.Step.To))
}

// view2D is the tensor's 2-D view: its rows (dim 0) and columns (the other
// dims), and a box's row and column ranges in it.
func view2D(shape []int) (rows, cols int) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return 1, shape[0]
	}
	cols = 1
	for _, n := range shape[1:] {
		cols *= n
	}
	return shape[0], cols
}

func boxRange(shape, off, full []int) (r0, r1, c0, c1 int) {
	switch len(full) {
	case 0:
		return 0, 1, 0, 1
	case 1:
		return 0, 1, off[0], off[0] + shape[0]
	}
	// Columns: dim 1's range, scaled by the dims after it (a box of the
	// trailing dims whole, as every layout of the drawn tensors is).
	inner := 1
	for _, n := range full[2:] {
		inner *= n
	}
	return off[0], off[0] + shape[0], off[1] * inner, (off[1] + shape[1]) * inner
}

// cuts are the sorted distinct boundaries of ranges along an axis of size n.
func cuts(n int, rs [][2]int) []int {
	c := []int{0, n}
	for _, r := range rs {
		c = append(c, r[0], r[1])
	}
	slices.Sort(c)
	return slices.Compact(c)
}

// spans maps the cells between cuts to widths (in characters or pixels):
// each at least min, the rest of total shared by size.
func spans(c []int, total, least int) []int {
	n := c[len(c)-1]
	out := make([]int, len(c)-1)
	for i := range out {
		w := int(math.Round(float64(total) * float64(c[i+1]-c[i]) / float64(max(n, 1))))
		out[i] = max(w, least)
	}
	return out
}

// grid is a tensor's drawing: the cells between the row and column cuts,
// each the block that holds it.
type grid struct {
	rows, cols []int // cuts
	cell       [][]int
	blocks     []block
	sum        bool
}

func gridOf(spec placement.Spec) grid {
	g := grid{blocks: blocksOf(spec), sum: partial(spec)}
	nr, nc := view2D(spec.Shape)
	var rr, cr [][2]int
	for _, b := range g.blocks {
		r0, r1, c0, c1 := boxRange(b.shape, b.off, spec.Shape)
		rr, cr = append(rr, [2]int{r0, r1}), append(cr, [2]int{c0, c1})
	}
	g.rows, g.cols = cuts(nr, rr), cuts(nc, cr)
	g.cell = make([][]int, len(g.rows)-1)
	for i := range g.cell {
		g.cell[i] = make([]int, len(g.cols)-1)
		for j := range g.cell[i] {
			g.cell[i][j] = -1
			for k := range g.blocks {
				if rr[k][0] <= g.rows[i] && g.rows[i+1] <= rr[k][1] && cr[k][0] <= g.cols[j] && g.cols[j+1] <= cr[k][1] {
					g.cell[i][j] = k
					break
				}
			}
		}
	}
	return g
}

// label is a block's text: its ranks and shape.
func (g grid) label(k int) string {
	if k < 0 {
		return "(none)"
	}
	b := g.blocks[k]
	return "r" + ranksText(b.ranks, g.sum) + " " + placement.FormatShape(b.shape)
}

// colours are ANSI background colours, by a block's first rank.
var colours = []string{"44", "42", "45", "46", "43", "41", "104", "102", "105", "106", "103", "101"}

// drawText writes t's grid in text: cells bordered by +, -, |, each
// labelled once, the first rank's colour behind it when colour is on.
func drawText(w io.Writer, t drawn, colour bool) {
	g := gridOf(t.spec)
	head := fmt.Sprintf("%s %s %s", t.name, placement.FormatShape(t.spec.Shape), placement.FormatList(t.spec.Placements))
	if t.note != "" {
		head += " (" + t.note + ")"
	}
	if g.sum {
		head += ": partial sums, each rank's block the whole tensor"
	}
	fmt.Fprintf(w, "%s, blocks %s\n", head, blocksText(t.spec))
	least := 0
	for k := range g.blocks {
		least = max(least, len(g.label(k))+2)
	}
	cw := spans(g.cols, max(48, least*(len(g.cols)-1)), least)
	rh := spans(g.rows, min(2*(len(g.rows)-1)+1, 6), 1)
	border := func() {
		var b strings.Builder
		b.WriteString("  +")
		for _, n := range cw {
			b.WriteString(strings.Repeat("-", n) + "+")
		}
		fmt.Fprintln(w, b.String())
	}
	border()
	for i := range rh {
		for line := range rh[i] {
			var b strings.Builder
			b.WriteString("  |")
			for j, n := range cw {
				k := g.cell[i][j]
				text := ""
				if line == (rh[i]-1)/2 {
					text = g.label(k)
				}
				cell := " " + text + strings.Repeat(" ", max(0, n-1-len(text)))
				if colour && k >= 0 {
					cell = "\x1b[" + colours[g.blocks[k].ranks[0]%len(colours)] + ";97m" + cell + "\x1b[0m"
				}
				b.WriteString(cell + "|")
			}
			fmt.Fprintln(w, b.String())
		}
		border()
	}
}

// svgFills are the blocks' fill colours, by first rank.
var svgFills = []string{"#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#e15759", "#9c755f", "#f28e2b", "#bab0ac", "#ff9da7", "#86bcb6", "#8cd17d"}

// drawSVG writes the tensors' grids and the collectives' lines as one SVG
// document.
func drawSVG(w io.Writer, title string, ts []drawn, moves []string) error {
	const width, cellH, pad = 720, 28, 16
	var body strings.Builder
	esc := func(s string) string {
		var b strings.Builder
		xml.EscapeText(&b, []byte(s))
		return b.String()
	}
	y := pad + 20
	fmt.Fprintf(&body, `<text x="%d" y="%d" font-size="16" font-weight="bold">%s</text>`+"\n", pad, y, esc(title))
	y += 16
	for _, t := range ts {
		g := gridOf(t.spec)
		y += 22
		head := fmt.Sprintf("%s %s %s", t.name, placement.FormatShape(t.spec.Shape), placement.FormatList(t.spec.Placements))
		if t.note != "" {
			head += " (" + t.note + ")"
		}
		if g.sum {
			head += ": partial sums"
		}
		fmt.Fprintf(&body, `<text x="%d" y="%d" font-size="13">%s, blocks %s</text>`+"\n", pad, y, esc(head), esc(blocksText(t.spec)))
		y += 6
		cw := spans(g.cols, width-2*pad, 24)
		rh := spans(g.rows, cellH*min(len(g.rows)-1, 4), cellH/2)
		yy := y
		for i := range rh {
			x := pad
			for j, n := range cw {
				k := g.cell[i][j]
				fill := "#ffffff"
				if k >= 0 {
					fill = svgFills[g.blocks[k].ranks[0]%len(svgFills)]
				}
				fmt.Fprintf(&body, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#333333"/>`+"\n", x, yy, n, rh[i], fill)
				fmt.Fprintf(&body, `<text x="%d" y="%d" font-size="11" fill="#000000">%s</text>`+"\n", x+4, yy+rh[i]/2+4, esc(g.label(k)))
				x += n
			}
			yy += rh[i]
		}
		y = yy + 4
	}
	if len(moves) > 0 {
		y += 24
		fmt.Fprintf(&body, `<text x="%d" y="%d" font-size="13" font-weight="bold">collectives</text>`+"\n", pad, y)
		for _, m := range moves {
			y += 18
			fmt.Fprintf(&body, `<text x="%d" y="%d" font-size="12" font-family="monospace">%s</text>`+"\n", pad, y, esc(m))
		}
	}
	y += pad
	_, err := fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n%s</svg>\n",
		width, y, width, y, body.String())
	return err
}

// opDrawing is an op's tensors and collectives, from its plans: the inputs
// as given, the output as it ends, each gradient as it ends.
func opDrawing(fwd *spmd.Plan, bwd *spmd.Backward) (ts []drawn, moves []string) {
	for _, in := range fwd.Inputs {
		ts = append(ts, drawn{name: in.Name, note: "given", spec: in.Spec})
	}
	ts = append(ts, drawn{name: fwd.Final.Name, note: "output", spec: fwd.Final.Spec})
	for _, c := range fwd.Collectives() {
		moves = append(moves, "forward: "+collectiveText(c))
	}
	if bwd == nil {
		return ts, moves
	}
	ts = append(ts, drawn{name: bwd.DY.Name, note: "the output's gradient as it arrives", spec: bwd.DY.Spec})
	for _, g := range bwd.Grads {
		ts = append(ts, drawn{name: g.Output.Name, note: "gradient", spec: g.Final.Spec})
	}
	for _, c := range bwd.Collectives() {
		moves = append(moves, "backward: "+collectiveText(c))
	}
	return ts, moves
}

// drawOp writes an op's drawing in text.
func drawOp(w io.Writer, title string, fwd *spmd.Plan, bwd *spmd.Backward, colour bool) {
	ts, moves := opDrawing(fwd, bwd)
	fmt.Fprintf(w, "== %s\n", title)
	for _, t := range ts {
		drawText(w, t, colour)
	}
	if len(moves) == 0 {
		fmt.Fprintln(w, "collectives: none")
	}
	for _, m := range moves {
		fmt.Fprintln(w, m)
	}
}
