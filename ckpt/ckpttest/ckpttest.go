// Package ckpttest damages checkpoint files for tests of what reads them.
package ckpttest

import (
	"os"
	"testing"
)

// FlipByte inverts one byte of a file: at off, or at size+off when off < 0.
func FlipByte(t testing.TB, name string, off int64) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0xff
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
