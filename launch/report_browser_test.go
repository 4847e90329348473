package launch

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/report"
)

// chromium is a headless-capable browser on PATH (or MESHRUN_CHROMIUM), or
// "".
func chromium() string {
	if p := os.Getenv("MESHRUN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestReportInBrowser: the page of a real job (mlp on 2 ranks, rank 1
// SIGKILLed after a checkpoint, the job restarted and resumed) opens in
// headless Chromium with no console message, and each of its plots drew:
// the screenshot has the three plot areas, each with its curves' colours
// inside, the split's bars and the timeline's spans. The screenshot is
// kept in MESHRUN_ARTIFACTS (when set) as report.png.
func TestReportInBrowser(t *testing.T) {
	browser := chromium()
	if browser == "" {
		if os.Getenv("MESHRUN_REQUIRE_CHROMIUM") == "1" {
			t.Fatal("no chromium on PATH (MESHRUN_REQUIRE_CHROMIUM=1)")
		}
		t.Skip("needs chromium: .ci/checks.d/report-chromium.sh installs it")
	}
	dir, _, _ := restartedJob(t, "report", []string{"mlp", "--tokens", "64", "--hidden", "128", "--steps", "300"})
	page := filepath.Join(t.TempDir(), "report.html")
	var out, rerr bytes.Buffer
	if code := report.Main([]string{"-o", page, dir}, &out, &rerr); code != 0 {
		t.Fatalf("launcher report: exit %d: %s", code, rerr.String())
	}
	shot := filepath.Join(t.TempDir(), "report.png")
	if a := os.Getenv("MESHRUN_ARTIFACTS"); a != "" {
		if err := os.MkdirAll(a, 0o755); err != nil {
			t.Fatal(err)
		}
		shot = filepath.Join(a, "report.png")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
		"--window-size=1000,2000", "--screenshot="+shot, "file://"+page)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	logs, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, logs)
	}
	for _, l := range strings.Split(string(logs), "\n") {
		if strings.Contains(l, "CONSOLE") {
			t.Errorf("the page logged to the console: %s", l)
		}
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	bands := plotBands(img)
	if len(bands) < 3 {
		t.Fatalf("%d plot areas in the screenshot (%s), want the loss's, the step time's and the bytes'", len(bands), shot)
	}
	for i, b := range bands[:3] {
		if n := colourIn(img, b, 0x4e, 0x79, 0xa7) + colourIn(img, b, 0xe1, 0x57, 0x59); n < 30 {
			t.Errorf("plot %d (rows %d to %d): %d pixels of its curves' colours: it did not draw", i, b[0], b[1], n)
		}
	}
	// Below the plots: the split's bars and the timeline's spans (blue).
	if n := colourIn(img, [2]int{bands[2][1], img.Bounds().Max.Y}, 0x4e, 0x79, 0xa7); n < 2000 {
		t.Errorf("%d blue pixels below the plots: the split's bars or the timeline did not draw", n)
	}
	t.Logf("screenshot %s: plot areas at rows %v", shot, bands)
}

// near reports whether colour c is within a few levels of (r, g, b).
func near(c [3]uint32, r, g, b uint32) bool {
	d := func(x, y uint32) bool { return x+2 >= y && y+2 >= x }
	return d(c[0], r) && d(c[1], g) && d(c[2], b)
}

func rgb(img image.Image, x, y int) [3]uint32 {
	r, g, b, _ := img.At(x, y).RGBA()
	return [3]uint32{r >> 8, g >> 8, b >> 8}
}

// plotBands are the row ranges where a plot's background (#fafafa) spans
// most of a row; a curve drawn across the whole plot splits its rows, so
// ranges a few rows apart are one plot.
func plotBands(img image.Image) [][2]int {
	bd := img.Bounds()
	var segs [][2]int
	start := -1
	for y := bd.Min.Y; y <= bd.Max.Y; y++ {
		n := 0
		for x := bd.Min.X; x < bd.Max.X && y < bd.Max.Y; x++ {
			if near(rgb(img, x, y), 0xfa, 0xfa, 0xfa) {
				n++
			}
		}
		in := n > bd.Dx()/2
		switch {
		case in && start < 0:
			start = y
		case !in && start >= 0:
			if k := len(segs); k > 0 && start-segs[k-1][1] <= 3 {
				segs[k-1][1] = y
			} else {
				segs = append(segs, [2]int{start, y})
			}
			start = -1
		}
	}
	var out [][2]int
	for _, s := range segs {
		if s[1]-s[0] > 40 {
			out = append(out, s)
		}
	}
	return out
}

// colourIn counts the pixels of colour (r, g, b) in rows band.
func colourIn(img image.Image, band [2]int, r, g, b uint32) int {
	bd := img.Bounds()
	n := 0
	for y := band[0]; y < band[1] && y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			if near(rgb(img, x, y), r, g, b) {
				n++
			}
		}
	}
	return n
}

// TestReportRunningJob: the page of a job still running shows the steps
// so far and says the job has not ended.
func TestReportRunningJob(t *testing.T) {
	logDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", "running", "--grace", "1s", "-n", "2",
			"mlp", "--tokens", "64", "--hidden", "128", "--steps", "1000000"}, io.Discard, io.Discard)
	}()
	dir := filepath.Join(logDir, "running")
	waitFor(t, 60*time.Second, "a few steps", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, RankDir(1), "steps.jsonl"))
		return bytes.Count(b, []byte("\n")) >= 5
	})
	page := filepath.Join(t.TempDir(), "report.html")
	var out, errb bytes.Buffer
	if code := report.Main([]string{dir, "-o", page}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"no summary.json yet", "running, or its launcher was killed", "recorded (rank 0)", "rank 1"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("no %q in the running job's page", want)
		}
	}
	cancel()
	<-done
}
