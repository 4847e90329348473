// Package ckpt writes and reads sharded checkpoints: a folder with one
// safetensors file per writing rank and an index.json that says which box of
// which tensor each file holds, so that a checkpoint written on one mesh loads
// on any other, each rank reading only the bytes it needs. It also reads and
// writes plain safetensors files (the format the ecosystem shares weights in).
//
// The package does no collective work: the ranks of a job coordinate a save
// and agree on a load through their own World (see linear's MLP.Save and
// LoadParams); this package is the format, its checks, and the reads.
package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/meshrun/meshrun/tensor"
)

// A safetensors file: an 8-byte little-endian header length N, N bytes of
// JSON (padded with spaces so that data starts 8-byte aligned), then the raw
// little-endian data of every tensor at its data_offsets (relative to the end
// of the header). "__metadata__" maps strings to strings.

// maxHeader bounds the JSON header a reader accepts (and allocates).
const maxHeader = 100 << 20

// DTypeName is safetensors' name of a dtype ("F32", "F64", "BF16").
func DTypeName(dt tensor.DType) string {
	switch dt {
	case tensor.Float32:
		return "F32"
	case tensor.Float64:
		return "F64"
	case tensor.BFloat16:
		return "BF16"
	}
	return ""
}

// ParseDTypeName is the inverse of DTypeName.
func ParseDTypeName(s string) (tensor.DType, bool) {
	switch s {
	case "F32":
		return tensor.Float32, true
	case "F64":
		return tensor.Float64, true
	case "BF16":
		return tensor.BFloat16, true
	}
	return 0, false
}

// Entry is one tensor of a safetensors file.
type Entry struct {
	Name  string
	DType tensor.DType
	Shape []int
	// Begin and End are the byte range of the data, relative to the data
	// section (the file offset is Header.DataStart + Begin).
	Begin, End int64
}

// Header is a parsed safetensors header.
type Header struct {
	Entries   []Entry // in data order
	Meta      map[string]string
	DataStart int64 // file offset of the data section
	DataLen   int64 // bytes of the data section
}

// Entry returns the entry named name.
func (h *Header) Entry(name string) (Entry, bool) {
	for _, e := range h.Entries {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

type jsonEntry struct {
	DType   string  `json:"dtype"`
	Shape   []int   `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// EncodeHeader returns the header bytes (length prefix, JSON, padding) for
// entries laid out one after the other in the given order, and fills in their
// Begin and End.
func EncodeHeader(entries []Entry, meta map[string]string) ([]byte, error) {
	m := map[string]any{}
	if len(meta) > 0 {
		m["__metadata__"] = meta
	}
	var off int64
	for i := range entries {
		e := &entries[i]
		name := DTypeName(e.DType)
		if name == "" {
			return nil, fmt.Errorf("%w: tensor %q: dtype %v", ErrFormat, e.Name, e.DType)
		}
		if e.Name == "" || e.Name == "__metadata__" {
			return nil, fmt.Errorf("%w: bad tensor name %q", ErrFormat, e.Name)
		}
		if _, dup := m[e.Name]; dup {
			return nil, fmt.Errorf("%w: tensor %q twice", ErrFormat, e.Name)
		}
		n := int64(tensor.NumElements(e.Shape)) * int64(e.DType.Size())
		e.Begin, e.End = off, off+n
		off += n
		m[e.Name] = jsonEntry{DType: name, Shape: append([]int{}, e.Shape...), Offsets: []int64{e.Begin, e.End}}
	}
	js, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	pad := (8 - len(js)%8) % 8
	js = append(js, bytes.Repeat([]byte(" "), pad)...)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	return append(out, js...), nil
}

// ReadHeader parses and checks the header of a safetensors file of size
// bytes: every entry's dtype is known, its shape matches its byte range, the
// ranges lie in the file and tile the data section without gaps or overlaps.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	var lb [8]byte
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes, too short for a header", ErrFormat, size)
	}
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, fmt.Errorf("%w: reading the header length: %v", ErrFormat, err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n == 0 || n > maxHeader || int64(n) > size-8 {
		return nil, fmt.Errorf("%w: header length %d in a file of %d bytes", ErrFormat, n, size)
	}
	js := make([]byte, n)
	if _, err := r.ReadAt(js, 8); err != nil {
		return nil, fmt.Errorf("%w: reading the header: %v", ErrFormat, err)
	}
	return parseHeader(js, 8+int64(n), size)
}

func parseHeader(js []byte, dataStart, size int64) (*Header, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(js))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: header JSON: %v", ErrFormat, err)
	}
	if rest := strings.TrimSpace(string(js[dec.InputOffset():])); rest != "" {
		return nil, fmt.Errorf("%w: bytes after the header JSON", ErrFormat)
	}
	h := &Header{DataStart: dataStart, DataLen: size - dataStart}
	for name, v := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(v, &h.Meta); err != nil {
				return nil, fmt.Errorf("%w: __metadata__: %v", ErrFormat, err)
			}
			continue
		}
		var je jsonEntry
		d := json.NewDecoder(bytes.NewReader(v))
		d.DisallowUnknownFields()
		if err := d.Decode(&je); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		dt, ok := ParseDTypeName(je.DType)
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q: dtype %q (want F32, F64 or BF16)", ErrFormat, name, je.DType)
		}
		if len(je.Offsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets %v", ErrFormat, name, je.Offsets)
		}
		n := int64(dt.Size())
		for _, d := range je.Shape {
			if d < 0 || (d > 0 && n > (1<<50)/int64(d)) {
				return nil, fmt.Errorf("%w: tensor %q: shape %v", ErrFormat, name, je.Shape)
			}
			n *= int64(d)
		}
		e := Entry{Name: name, DType: dt, Shape: je.Shape, Begin: je.Offsets[0], End: je.Offsets[1]}
		if e.Begin < 0 || e.End-e.Begin != n {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets %v for %v %v (%d bytes)", ErrFormat, name, je.Offsets, je.DType, je.Shape, n)
		}
		h.Entries = append(h.Entries, e)
	}
	sort.Slice(h.Entries, func(i, j int) bool {
		a, b := h.Entries[i], h.Entries[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	var pos int64
	for _, e := range h.Entries {
		if e.Begin != pos {
			return nil, fmt.Errorf("%w: tensor %q starts at %d, the data before it ends at %d", ErrFormat, e.Name, e.Begin, pos)
		}
		pos = e.End
	}
	if pos != h.DataLen {
		return nil, fmt.Errorf("%w: the tensors hold %d bytes, the data section %d (truncated or padded file)", ErrFormat, pos, h.DataLen)
	}
	return h, nil
}

// Names returns the entries' names, sorted.
func (h *Header) Names() []string {
	names := make([]string, len(h.Entries))
	for i, e := range h.Entries {
		names[i] = e.Name
	}
	slices.Sort(names)
	return names
}
