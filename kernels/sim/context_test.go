package sim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// TestContexts: Run makes the device's primary context current on the
// calling thread for its duration and no longer; a Run of another device
// inside it switches to that device's context and back; a Run of the same
// memory inside its own is an error (the cuda provider's would deadlock).
func TestContexts(t *testing.T) {
	a, b := sim.NewMemory(0), sim.NewMemory(1)
	if c := sim.Current(); c != "" {
		t.Fatalf("context current outside Run: %q", c)
	}
	err := a.Run(func() error {
		if c := sim.Current(); c != a.Context() {
			t.Errorf("in a's Run: %q, want %q", c, a.Context())
		}
		if err := b.Run(func() error {
			if c := sim.Current(); c != b.Context() {
				t.Errorf("in b's Run inside a's: %q, want %q", c, b.Context())
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if c := sim.Current(); c != a.Context() {
			t.Errorf("after b's Run: %q, want a's back", c)
		}
		return a.Run(func() error { return nil })
	})
	if !errors.Is(err, tensor.ErrDevice) || !strings.Contains(err.Error(), "inside its own Run") {
		t.Errorf("Run inside its own Run: %v", err)
	}
	if c := sim.Current(); c != "" {
		t.Errorf("context left current after Run: %q", c)
	}
	want := errors.New("f's error")
	if err := a.Run(func() error { return want }); err != want {
		t.Errorf("Run returned %v, want f's error", err)
	}
	// Another goroutine, while a's Run holds its thread, has no context.
	done := make(chan string)
	a.Run(func() error {
		go func() { done <- sim.Current() }()
		if c := <-done; c != "" {
			t.Errorf("another goroutine sees %q", c)
		}
		return nil
	})
}

// TestDeviceIdentity: memories of one ordinal in one process are one device
// (one identity and primary context, as in-process ranks on one GPU), other
// ordinals and the memories made under SeparateDevices are devices of their
// own; every memory has a stream of its own, never 0.
func TestDeviceIdentity(t *testing.T) {
	a, b, c := sim.NewMemory(0), sim.NewMemory(0), sim.NewMemory(1)
	if a.DeviceID() != b.DeviceID() || a.Context() != b.Context() {
		t.Errorf("two memories of sim:0: %q and %q", a.DeviceID(), b.DeviceID())
	}
	if a.DeviceID() == c.DeviceID() || a.Context() == c.Context() {
		t.Errorf("sim:0 and sim:1 are one device: %q", a.DeviceID())
	}
	if !strings.HasPrefix(a.DeviceID(), "sim:0@") {
		t.Errorf("identity %q", a.DeviceID())
	}
	restore := sim.SeparateDevices()
	d, e := sim.NewMemory(0), sim.NewMemory(0)
	restore()
	restore() // once only
	if d.DeviceID() == e.DeviceID() || d.DeviceID() == a.DeviceID() || d.Device() != a.Device() {
		t.Errorf("separate devices: %q %q (%v), shared %q", d.DeviceID(), e.DeviceID(), d.Device(), a.DeviceID())
	}
	if f := sim.NewMemory(0); f.DeviceID() != a.DeviceID() {
		t.Errorf("after restore: %q, want %q", f.DeviceID(), a.DeviceID())
	}
	if a.Stream() == 0 || a.Stream() == b.Stream() {
		t.Errorf("streams %#x %#x", a.Stream(), b.Stream())
	}
}
