package testtime

import (
	"testing"
	"time"
)

func TestScale(t *testing.T) {
	want := 1.0
	if race {
		want = raceFactor
	}
	t.Setenv(Env, "")
	if got := Scale(time.Second); got != time.Duration(want*float64(time.Second)) {
		t.Errorf("Scale(1s) = %v, want %v", got, want)
	}
	t.Setenv(Env, "2.5")
	if got := Scale(time.Second); got != time.Duration(2.5*want*float64(time.Second)) {
		t.Errorf("Scale(1s) with %s=2.5 = %v", Env, got)
	}
	t.Setenv(Env, "0.1") // a factor below 1 would tighten limits: ignored
	if got := Factor(); got != want {
		t.Errorf("Factor with %s=0.1 = %v, want %v", Env, got, want)
	}
}
