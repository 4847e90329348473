package report

import (
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// Write writes j's page: one HTML document with its CSS and SVG inline and
// no script, readable offline and from a copy of the folder.
func Write(w io.Writer, j *Job) error {
	var b strings.Builder
	title := "meshrun job " + jobID(j)
	fmt.Fprintf(&b, `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
.note{color:#8a4b00;font-size:13px} .bad{color:#b00020;font-weight:bold} .ok{color:#11743a;font-weight:bold}
svg{display:block;margin:8px 0} text{font-size:11px}
</style></head><body>
<h1>%s</h1>
`, esc(title), esc(title))
	writeSummary(&b, j)
	for _, n := range j.Notes {
		fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", esc(n))
	}
	writeLoss(&b, j)
	writeStepTimes(&b, j)
	writeBreakdown(&b, j)
	writeBytes(&b, j)
	writePipeline(&b, j)
	writeTimeline(&b, j)
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string { return html.EscapeString(s) }

func jobID(j *Job) string {
	if j.Record != nil && j.Record.JobID != "" {
		return j.Record.JobID
	}
	return j.Dir
}

// writeSummary is the table of what ran and how it ended.
func writeSummary(b *strings.Builder, j *Job) {
	b.WriteString("<table>\n")
	row := func(k, v string) { fmt.Fprintf(b, "<tr><th>%s</th><td>%s</td></tr>\n", esc(k), v) }
	if r := j.Record; r != nil {
		row("command", esc(strings.Join(r.Argv, " ")))
		row("ranks", esc(fmt.Sprintf("%d on %d node(s)", r.World, max(r.NNodes, 1))))
		row("device", esc(r.Device+kernelsOf(r)))
		if r.DType != "" {
			row("dtype", esc(r.DType))
		}
	}
	if rep := j.Report; rep != nil {
		for _, k := range []string{"mesh", "dtype", "tokens", "batch", "context", "layers", "dim"} {
			if v, ok := rep[k]; ok {
				row(k, esc(fmt.Sprint(v)))
			}
		}
	}
	switch s := j.Summary; {
	case s == nil:
		row("outcome", `<span class="note">running, or its launcher was killed (no summary.json)</span>`)
	case s.Reason == logview.OutcomeOK:
		row("outcome", fmt.Sprintf(`<span class="ok">ok</span> (exit %d, %.1f s)`, s.ExitCode, float64(s.DurationMS)/1000))
	default:
		row("outcome", fmt.Sprintf(`<span class="bad">%s</span> (exit %d)`, esc(s.Reason.String()), s.ExitCode))
		if rc := s.RootCause; rc != nil {
			row("root cause", esc(fmt.Sprintf("rank %d (node %d): %s", rc.Rank, rc.Node, rootCauseText(rc))))
		}
	}
	if s := j.Summary; s != nil && len(s.Attempts) > 1 {
		var parts []string
		for _, a := range s.Attempts {
			parts = append(parts, fmt.Sprintf("%d: %s", a.Attempt, a.Reason))
		}
		row("attempts", esc(strings.Join(parts, "; ")))
	}
	if n := len(j.steps(0)); n > 0 {
		st := j.steps(0)
		ms := make([]float64, n)
		for i, s := range st {
			ms[i] = s.StepMS
		}
		sort.Float64s(ms)
		med := ms[n/2]
		row("steps", esc(fmt.Sprintf("%d recorded (rank 0); median step %.2f ms, %.1f steps/s%s", n, med, 1000/med, tokensPerS(j, med))))
	}
	b.WriteString("</table>\n")
}

func kernelsOf(r *logview.JobRecord) string {
	if r.Kernels == "" {
		return ""
	}
	return ", kernels " + r.Kernels
}

func rootCauseText(rc *logview.RootCause) string {
	switch {
	case rc.Signal != "":
		return "killed by " + rc.Signal
	case rc.Error != "":
		return rc.Error
	}
	return fmt.Sprintf("exit %d", rc.ExitCode)
}

// tokensPerS is ", N tokens/s" when the report says the tokens of a step.
func tokensPerS(j *Job, stepMS float64) string {
	var tokens float64
	if v, ok := j.Report["tokens"].(float64); ok {
		tokens = v
	} else if bt, ok := j.Report["batch"].(float64); ok {
		if c, ok := j.Report["context"].(float64); ok {
			tokens = bt * c
		}
	}
	if tokens == 0 || stepMS == 0 {
		return ""
	}
	return fmt.Sprintf(", %.0f tokens/s", tokens*1000/stepMS)
}

// series is a curve: x and y per point; colour indexes colours (curves of
// one colour are one thing: a rank's attempts), and an empty label is not
// listed again.
type series struct {
	label  string
	x, y   []float64
	colour int
}

// decimate keeps a curve of many points drawable: per column of the plot,
// the first point and the column's least and largest (no extreme dropped).
func decimate(s series, cols int) series {
	if len(s.x) <= 2*cols {
		return s
	}
	out := series{label: s.label, colour: s.colour}
	lo, hi := s.x[0], s.x[len(s.x)-1]
	for i := 0; i < len(s.x); {
		col := int(float64(cols) * (s.x[i] - lo) / math.Max(hi-lo, 1e-12))
		j := i
		mi, ma := i, i
		for j < len(s.x) && int(float64(cols)*(s.x[j]-lo)/math.Max(hi-lo, 1e-12)) == col {
			if s.y[j] < s.y[mi] {
				mi = j
			}
			if s.y[j] > s.y[ma] {
				ma = j
			}
			j++
		}
		for _, k := range uniqueSorted(i, mi, ma) {
			out.x, out.y = append(out.x, s.x[k]), append(out.y, s.y[k])
		}
		i = j
	}
	return out
}

func uniqueSorted(vs ...int) []int {
	sort.Ints(vs)
	out := vs[:0]
	for i, v := range vs {
		if i == 0 || v != vs[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// colours of the curves and bars.
var colours = []string{"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"}

// mark is a vertical marker of a plot: a restart, a checkpoint.
type mark struct {
	x      float64
	label  string
	colour string
	dash   string
}

// plot draws curves on shared axes, with vertical markers.
func plot(b *strings.Builder, title, ylabel string, ss []series, marks []mark) {
	const w, h, l, r, t, bo = 900, 260, 60, 20, 20, 36
	var minX, maxX, minY, maxY = math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for i := range ss {
		ss[i] = decimate(ss[i], w-l-r)
		for k := range ss[i].x {
			minX, maxX = math.Min(minX, ss[i].x[k]), math.Max(maxX, ss[i].x[k])
			minY, maxY = math.Min(minY, ss[i].y[k]), math.Max(maxY, ss[i].y[k])
		}
	}
	fmt.Fprintf(b, "<h2>%s</h2>\n", esc(title))
	if math.IsInf(minX, 0) {
		b.WriteString("<p class=\"note\">nothing recorded</p>\n")
		return
	}
	if maxX == minX {
		maxX = minX + 1
	}
	if maxY == minY { // a constant: from 0 (or around it)
		if minY >= 0 {
			minY, maxY = 0, math.Max(1.25*maxY, 1)
		} else {
			maxY, minY = maxY+1, minY-1
		}
	}
	px := func(x float64) float64 { return l + (x-minX)/(maxX-minX)*(w-l-r) }
	py := func(y float64) float64 { return t + (maxY-y)/(maxY-minY)*(h-t-bo) }
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n", w, h, w, h, esc(title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#999"/>`+"\n", l, t, w-l-r, h-t-bo)
	for k := 0; k <= 4; k++ {
		y := minY + (maxY-minY)*float64(k)/4
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", l-4, py(y)+4, fmtNum(y, maxY-minY))
		x := minX + (maxX-minX)*float64(k)/4
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), h-bo+16, fmtNum(x, maxX-minX))
	}
	fmt.Fprintf(b, `<text x="12" y="%d" transform="rotate(-90 12 %d)" text-anchor="middle">%s</text>`+"\n", (h-bo+t)/2, (h-bo+t)/2, esc(ylabel))
	for i, m := range marks {
		if m.x < minX || m.x > maxX {
			continue
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-dasharray="%s"/><text x="%.1f" y="%d" fill="%s">%s</text>`+"\n",
			px(m.x), t, px(m.x), h-bo, m.colour, m.dash, px(m.x)+3, t+12+12*(i%2), m.colour, esc(m.label))
	}
	legend := 0
	for _, s := range ss {
		var pts []string
		for k := range s.x {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.x[k]), py(s.y[k])))
		}
		c := colours[s.colour%len(colours)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		if s.label != "" {
			fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", l+8+140*legend, h-4, c, esc(s.label))
			legend++
		}
	}
	b.WriteString("</svg>\n")
}

// fmtNum writes an axis value with the decimals its axis's span needs.
func fmtNum(v, span float64) string {
	if a := math.Abs(v); a >= 1e6 || a != 0 && a < 1e-3 {
		return fmt.Sprintf("%.3g", v)
	}
	d := 0
	if span > 0 {
		d = max(0, int(math.Ceil(-math.Log10(span/4))))
	}
	return strconv.FormatFloat(v, 'f', min(d, 6), 64)
}

// restarts mark the steps where each attempt after the first began, and
// the checkpoints saved.
func restarts(j *Job) []mark {
	var out []mark
	for _, a := range j.Attempts[1:] {
		if s := a.Ranks[0]; len(s) > 0 {
			out = append(out, mark{x: float64(s[0].Step), label: "restart", colour: "#b00020", dash: "4 3"})
		}
	}
	for _, s := range j.Saves {
		out = append(out, mark{x: float64(s), label: "ckpt", colour: "#11743a", dash: "1 3"})
	}
	return out
}

// writeLoss is the loss per step, one curve per attempt, and the held-out
// loss where the report has one.
func writeLoss(b *strings.Builder, j *Job) {
	var ss []series
	for i, a := range j.Attempts {
		s := series{label: fmt.Sprintf("attempt %d", a.N), colour: i}
		for _, st := range a.Ranks[0] {
			s.x, s.y = append(s.x, float64(st.Step)), append(s.y, st.Loss)
		}
		if len(s.x) > 0 {
			ss = append(ss, s)
		}
	}
	if v, ok := j.Report["heldout_loss"].(float64); ok && len(ss) > 0 {
		last := ss[len(ss)-1]
		ss = append(ss, series{label: "held-out (end)", x: []float64{last.x[0], last.x[len(last.x)-1]}, y: []float64{v, v}, colour: len(ss)})
	}
	plot(b, "Loss per step (rank 0)", "loss", ss, restarts(j))
}

// writeStepTimes is each rank's step time per step.
func writeStepTimes(b *strings.Builder, j *Job) {
	var ss []series
	for i, r := range j.ranks() {
		label := fmt.Sprintf("rank %d", r)
		for _, a := range j.Attempts { // an attempt resumes from a checkpoint: a curve each
			s := series{label: label, colour: i}
			for _, st := range a.Ranks[r] {
				s.x, s.y = append(s.x, float64(st.Step)), append(s.y, st.StepMS)
			}
			if len(s.x) > 0 {
				ss, label = append(ss, s), ""
			}
		}
	}
	plot(b, "Step time per rank", "ms", ss, restarts(j))
}

// mean is a rank's mean kernel, collective and other time per step over its
// steps after the first of each attempt (warm-up).
func mean(steps []runlog.StepRecord) (k, c, o float64, n int) {
	for i, s := range steps {
		if i == 0 && len(steps) > 1 {
			continue
		}
		k, c, o, n = k+s.KernelMS, c+s.CollectiveMS, o+s.OtherMS, n+1
	}
	if n == 0 {
		return 0, 0, 0, 0
	}
	return k / float64(n), c / float64(n), o / float64(n), n
}

// writeBreakdown is each rank's mean step split into kernels, collectives
// and the rest, as stacked bars.
func writeBreakdown(b *strings.Builder, j *Job) {
	b.WriteString("<h2>Where a step goes, per rank (mean over the steps after the first)</h2>\n")
	rs := j.ranks()
	if len(rs) == 0 {
		b.WriteString("<p class=\"note\">nothing recorded</p>\n")
		return
	}
	const w, l, bar, gap = 900, 70, 18, 8
	h := 30 + len(rs)*(bar+gap)
	top := 0.0
	type part struct{ k, c, o float64 }
	parts := map[int]part{}
	for _, r := range rs {
		k, c, o, _ := mean(j.steps(r))
		parts[r] = part{k, c, o}
		top = math.Max(top, k+c+o)
	}
	if top == 0 {
		top = 1
	}
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="step breakdown">`+"\n", w, h, w, h)
	scale := float64(w-l-330) / top
	for i, r := range rs {
		p, y := parts[r], 10+i*(bar+gap)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">rank %d</text>`+"\n", l-6, y+13, r)
		x := float64(l)
		for k, v := range []float64{p.k, p.c, p.o} {
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x, y, v*scale, bar, colours[k])
			x += v * scale
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d">%.2f ms = kernels %.2f + collectives %.2f + other %.2f</text>`+"\n", x+6, y+13, p.k+p.c+p.o, p.k, p.c, p.o)
	}
	for k, name := range []string{"kernels", "collectives", "other (host, launches, waiting)"} {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", l+k*200, h-12, colours[k], l+k*200+14, h-3, esc(name))
	}
	b.WriteString("</svg>\n")
}

// writeBytes is the bytes the collectives moved per step (rank 0) and the
// collectives of a step, from the report.
func writeBytes(b *strings.Builder, j *Job) {
	var ss []series
	label := "rank 0"
	for _, a := range j.Attempts {
		s := series{label: label}
		for _, st := range a.Ranks[0] {
			s.x, s.y = append(s.x, float64(st.Step)), append(s.y, float64(st.CommBytes)/(1<<20))
		}
		if len(s.x) > 0 {
			ss, label = append(ss, s), ""
		}
	}
	plot(b, "Bytes the collectives moved per step (rank 0)", "MiB", ss, restarts(j))
	// Bytes by kind: the mean per step over rank 0's steps.
	kinds := map[string]float64{}
	steps := j.steps(0)
	for _, st := range steps {
		for k, v := range st.CollectiveBytes {
			kinds[k] += float64(v) / float64(len(steps))
		}
	}
	keyTable(b, "collective kind", "bytes per step, rank 0 (mean)", kinds, func(v float64) string { return fmt.Sprintf("%.0f", v) })
	cs, _ := j.Report["collectives_per_step"].(map[string]any)
	keyTable(b, "collective (kind and tensor)", "per step, rank 0", cs, func(v any) string { return fmt.Sprint(v) })
}

// keyTable writes a table of m's keys, sorted, beside their values as val
// prints them, under the heads k and v; nothing for an empty m.
func keyTable[V any](b *strings.Builder, k, v string, m map[string]V, val func(V) string) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintf(b, "<table><tr><th>%s</th><th>%s</th></tr>\n", esc(k), esc(v))
	for _, key := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(b, "<tr><td>%s</td><td>%s</td></tr>\n", esc(key), esc(val(m[key])))
	}
	b.WriteString("</table>\n")
}

// writePipeline is a pipelined GPT's stages (the report's "pipeline"):
// each stage's layers, bubble as measured and as its schedule gives it at
// the stage's median costs, its peak of micro-batches held, and those
// costs.
func writePipeline(b *strings.Builder, j *Job) {
	pl, ok := j.Report["pipeline"].(map[string]any)
	if !ok {
		return
	}
	num := func(v any) (float64, bool) { f, ok := v.(float64); return f, ok }
	list := func(k string) []any { l, _ := pl[k].([]any); return l }
	at := func(k string, s int) any {
		if l := list(k); s < len(l) {
			return l[s]
		}
		return nil
	}
	pct := func(v any) string {
		if f, ok := num(v); ok {
			return fmt.Sprintf("%.1f%%", 100*f)
		}
		return "—"
	}
	b.WriteString("<h2>Pipeline stages</h2>\n")
	model, chunks := "; 1F1B's and GPipe's bubble at equal stages, (p−1)/(m+p−1): %.1f%%", ""
	if c, ok := num(pl["chunks"]); ok && c > 1 {
		model = "; its bubble at equal stages, (p−1)/(v·m+p−1): %.1f%%"
		chunks = fmt.Sprintf(" over %.0f chunks a stage (each stage's layers the sum of its chunks')", c)
	}
	if f, ok := num(pl["bubble_model"]); ok {
		model = fmt.Sprintf(model, 100*f)
	} else {
		model = ""
	}
	fmt.Fprintf(b, "<p>schedule %s%s, %v micro-batches per step%s. A stage's bubble is its idle share of the step (the median over the steps after the first); at its costs, what the schedule gives were every action its median; at its actions' times, the step replayed with every action as long as it ran; its own, the part of the step it spent between actions on its own work (the rest of the bubble is waiting for its neighbours).</p>\n",
		esc(fmt.Sprint(pl["schedule"])), esc(chunks), esc(fmt.Sprint(pl["micro_batches"])), esc(model))
	b.WriteString("<table><tr><th>stage</th><th>layers</th><th>bubble</th><th>at its costs</th><th>at its actions' times</th><th>its own</th><th>peak micro-batches</th><th>their scratch (MiB)</th><th>workspace (MiB)</th><th>median F, B, W (ms)</th><th>median send (ms)</th></tr>\n")
	for s := range list("bubble") {
		costs := "—"
		if c, ok := at("cost_ms", s).(map[string]any); ok {
			f, _ := num(c["F"])
			bb, _ := num(c["B"])
			w, _ := num(c["W"])
			costs = fmt.Sprintf("%.2f, %.2f, %.2f", f, bb, w)
		}
		send := "—"
		if f, ok := num(at("send_ms", s)); ok {
			send = fmt.Sprintf("%.3f", f)
		}
		mib := func(key string) string {
			if f, ok := num(at(key, s)); ok {
				return fmt.Sprintf("%.1f", f/(1<<20))
			}
			return "—"
		}
		own := "—"
		if f, ok := num(at("overhead", s)); ok {
			own = fmt.Sprintf("%.2f%%", 100*f)
		}
		fmt.Fprintf(b, "<tr><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n", s,
			esc(fmt.Sprint(at("stage_layers", s))), pct(at("bubble", s)), pct(at("bubble_at_cost", s)), pct(at("bubble_replayed", s)), own,
			esc(fmt.Sprint(at("peak_activations", s))), mib("scratch_bytes"), mib("workspace_bytes"), costs, send)
	}
	b.WriteString("</table>\n")
}

// writeTimeline is one step across the ranks: each rank a row of its
// spans, coloured by kind.
func writeTimeline(b *strings.Builder, j *Job) {
	tl := j.Timeline
	b.WriteString("<h2>One step across the ranks</h2>\n")
	if tl == nil {
		b.WriteString("<p class=\"note\">no trace of the ranks' spans (trace.json)</p>\n")
		return
	}
	fmt.Fprintf(b, "<p>step %d of the last attempt, %.2f ms on rank 0; each rank's kernels, collectives and pipeline actions</p>\n", tl.Step, tl.StepMS)
	const w, l, row = 900, 70, 22
	h := 20 + len(tl.Ranks)*row + 20
	lo, hi := 0.0, tl.StepMS
	for _, sp := range tl.Spans {
		for _, s := range sp {
			lo, hi = math.Min(lo, s.Start), math.Max(hi, s.Start+s.Dur)
		}
	}
	if hi <= lo {
		hi = lo + 1
	}
	px := func(v float64) float64 { return l + (v-lo)/(hi-lo)*float64(w-l-10) }
	cats := map[string]string{"kernel": colours[0], "collective": colours[1], "pipeline": colours[2]}
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="timeline">`+"\n", w, h, w, h)
	for i, r := range tl.Ranks {
		y := 10 + i*row
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">rank %d</text>`+"\n", l-6, y+14, r)
		for _, s := range tl.Spans[r] {
			c, ok := cats[s.Cat]
			if !ok {
				continue // an op's span holds its kernels and collectives
			}
			// A pipeline action holds its kernels: it is the row's lower
			// strip, they its upper part.
			sy, sh := y, row-10
			if s.Cat == "pipeline" {
				sy, sh = y+row-9, 5
			}
			fmt.Fprintf(b, `<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %s %.3f ms</title></rect>`+"\n",
				px(s.Start), sy, math.Max(px(s.Start+s.Dur)-px(s.Start), 0.5), sh, c, esc(s.Cat), esc(s.Name), s.Dur)
		}
	}
	k := 0
	for _, name := range []string{"kernel", "collective", "pipeline"} {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", l+k*160, h-14, cats[name], l+k*160+14, h-5, name)
		k++
	}
	b.WriteString("</svg>\n")
}
