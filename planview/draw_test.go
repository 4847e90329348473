package planview

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDrawGolden pins `launcher plan --draw` in text (colour off): a
// column- and a row-parallel linear on tp=2 (the row-parallel output
// Partial), dp=2,tp=2, an uneven split (10 rows on 4 ranks), and the MLP
// block.
func TestDrawGolden(t *testing.T) {
	for _, tc := range []struct{ file, args string }{
		{"column-tp2.txt", "--mesh tp=2 --x 8x16:[R] --w 32x16:[S(0)] --b 32:[S(0)]"},
		{"row-tp2-partial.txt", "--mesh tp=2 --x 8x16:[S(1)] --w 32x16:[S(1)] --out [P]"},
		{"dp2-tp2.txt", "--mesh dp=2,tp=2 --x 8x16:[S(0),R] --w 32x16:[R,S(0)] --b 32:[R,S(0)]"},
		{"uneven-10-on-4.txt", "--mesh 4 --x 10x8:[S(0)] --w 6x8:[R]"},
		{"mlp-tp2.txt", "--block mlp --mesh tp=2 --tokens 8 --hidden 16 --ffn 32"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append(strings.Fields(tc.args), "--draw")
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if strings.Contains(out.String(), "\x1b[") {
				t.Errorf("colour codes in a drawing not written to a terminal")
			}
			golden(t, filepath.Join("testdata", "draw", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
}

// TestDrawSVG: --draw svg -o FILE writes an SVG an XML parser reads, a
// rectangle per block of each tensor and the collectives' lines.
func TestDrawSVG(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plan.svg")
	var out, errb bytes.Buffer
	args := []string{"--mesh", "tp=2", "--x", "8x16:[S(1)]", "--w", "32x16:[S(1)]", "--out", "[R]", "--draw", "svg", "-o", file}
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	rects, texts := 0, []string{}
	var root string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG does not parse: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = e.Name.Local
			}
			if e.Name.Local == "rect" {
				rects++
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(e)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	// x, w (two blocks each), y (one), dy (one), dx and dw (two each).
	if root != "svg" || rects != 10 {
		t.Errorf("root %q, %d rectangles; want svg and 10", root, rects)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"y all_reduce over tp: [0+1] -> [0,1]", "r0 8x8", "r0,1 8x32"} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q in the SVG's text:\n%s", want, all)
		}
	}
}

// TestDrawColour: in colour each block's cells have its first rank's
// background; the text is the same without the codes.
func TestDrawColour(t *testing.T) {
	o, err := ParsePlanFlags(strings.Fields("--mesh tp=2 --x 8x16:[R] --w 32x16:[S(0)] --draw"))
	if err != nil {
		t.Fatal(err)
	}
	var plain, colour bytes.Buffer
	if err := RunPlanContext(context.Background(), &plain, o); err != nil {
		t.Fatal(err)
	}
	o.Colour = true
	if err := RunPlanContext(context.Background(), &colour, o); err != nil {
		t.Fatal(err)
	}
	c := colour.String()
	if !strings.Contains(c, "\x1b[44;97m r0 16x16") || !strings.Contains(c, "\x1b[42;97m r1 16x16") {
		t.Errorf("no rank colours in:\n%q", c)
	}
	stripped := c
	for _, code := range []string{"\x1b[44;97m", "\x1b[42;97m", "\x1b[0m"} {
		stripped = strings.ReplaceAll(stripped, code, "")
	}
	if stripped != plain.String() {
		t.Errorf("the coloured drawing's text differs from the plain one")
	}
}
