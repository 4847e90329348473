package collective

import (
	"errors"
	"testing"

	"github.com/meshrun/meshrun/tensor"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Op: OpAllGather, DType: tensor.Float64, RedOp: 2, Job: 1, Group: 2, Seq: 3, Src: 4, Dst: 5, Count: 6, Shape: 7, Step: 8, Chunk: 9, Offset: 10, Length: 11}
	var b [HeaderSize]byte
	h.Encode(b[:])
	got, err := DecodeHeader(b[:], 0)
	if err != nil || got != h {
		t.Fatalf("%+v %v", got, err)
	}
	for i := range b {
		c := b
		c[i] ^= 0x40
		if _, err := DecodeHeader(c[:], 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d accepted", i)
		}
	}
	h.Length = MaxPayload + 1
	h.Encode(b[:])
	if _, err := DecodeHeader(b[:], 0); !errors.Is(err, ErrCorrupt) {
		t.Fatal("oversized payload accepted")
	}
	if n := testing.AllocsPerRun(100, func() { DecodeHeader(b[:], 0) }); n != 0 {
		t.Fatalf("DecodeHeader allocates %v", n)
	}
}

func TestCheckHeaderNamesBoth(t *testing.T) {
	want := Header{Op: OpAllReduce, DType: tensor.Float32, Seq: 3, Src: 1, Dst: 0, Count: 100}
	got := want
	got.Op, got.Count = OpAllGather, 50
	err := CheckHeader(&want, &got)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrMismatch) || e.Rank != 1 {
		t.Fatalf("%v", err)
	}
	for _, s := range []string{"all_reduce(sum) float32 count=100", "all_gather float32 count=50"} {
		if !contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// FuzzDecodeMessage: the decoder never panics, never allocates, and accepts
// only messages whose payload fits the declared bound and the buffer.
func FuzzDecodeMessage(f *testing.F) {
	h := Header{Op: OpAllReduce, DType: tensor.Float32, Count: 4, Length: 16}
	b := make([]byte, HeaderSize+16)
	h.Encode(b)
	f.Add(b)
	f.Add(b[:HeaderSize])
	f.Add([]byte("MRC1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var hd Header
		var p []byte
		var err error
		allocs := testing.AllocsPerRun(1, func() { hd, p, err = DecodeMessage(data, 1<<20) })
		if allocs != 0 {
			t.Fatalf("decoder allocated %v times", allocs)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if int(hd.Length) != len(p) || hd.Length > 1<<20 || len(data) != HeaderSize+len(p) {
			t.Fatalf("accepted length %d with %d payload bytes of %d", hd.Length, len(p), len(data))
		}
		var re [HeaderSize]byte
		hd.Encode(re[:])
		if string(re[:]) != string(data[:HeaderSize]) {
			t.Fatal("decode/encode is not the identity on an accepted header")
		}
	})
}
