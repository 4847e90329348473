package logview

import (
	"testing"
	"time"
)

func TestLogsFilters(t *testing.T) {
	now := time.Now()
	o := LogsOptions{Level: "warn", Since: time.Minute}
	for _, tc := range []struct {
		e    Entry
		keep bool
	}{
		{Entry{TimeMS: now.UnixMilli(), Level: "error", Stream: "log", Msg: "x"}, true},
		{Entry{TimeMS: now.UnixMilli(), Level: "info", Stream: "stdout", Msg: "x"}, false},
		{Entry{TimeMS: now.Add(-2 * time.Minute).UnixMilli(), Level: "error", Stream: "log", Msg: "x"}, false},
	} {
		if got := o.keep(tc.e, now); got != tc.keep {
			t.Errorf("%+v: keep %v", tc.e, got)
		}
	}
	tf := &tailFile{stream: "stderr", rank: 1}
	if e, ok := tf.parse("2026-11-22T13:51:12.291Z WARN careful"); !ok || e.Level != "warn" || e.Msg != "WARN careful" || e.TimeMS != time.Date(2026, 11, 22, 13, 51, 12, 291e6, time.UTC).UnixMilli() {
		t.Errorf("stderr line: %+v %v", e, ok)
	}
	if _, ok := tf.parse("2026-11-22T13:51:12.291Z @meshrun:progress {}"); ok {
		t.Error("marker line shown")
	}
}

func FuzzParseRanks(f *testing.F) {
	for _, s := range []string{"0,4-7", "3", "1-1", "2,0", "a", "-", "5-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := ParseRanks(s)
		if err != nil {
			return
		}
		var rs []int
		for r := range set {
			rs = append(rs, r)
		}
		again, err := ParseRanks(FormatRanks(rs))
		if err != nil || len(again) != len(set) {
			t.Fatalf("%q -> %q -> %v, %v", s, FormatRanks(rs), again, err)
		}
		for r := range set {
			if !again[r] {
				t.Fatalf("%q lost rank %d", s, r)
			}
		}
	})
}

func FuzzParseTrace(f *testing.F) {
	f.Add([]byte("[\n{\"name\":\"a\",\"ph\":\"X\",\"ts\":1,\"dur\":2,\"pid\":0,\"tid\":1},\n"))
	f.Add([]byte(`{"traceEvents":[{"name":"a"}]}`))
	f.Add([]byte("[\n{\"name\":\"a\"},\n{\"na"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseTrace(b) // never panics
	})
}
