package ckpt

import (
	"bufio"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/meshrun/meshrun/tensor"
)

// Read fills dst with the box [off, off+shape) of tensor name (dense,
// row-major, the tensor's dtype). From each file box it intersects, it reads
// the bytes of the intersection, and the checksum blocks they lie in, and
// verifies every such block before using a byte of it: data that does not
// match its checksum is ErrCorrupt naming the file, the tensor and the block.
// Reads go through one ioChunk scratch buffer (the kernel copies into memory
// that stays hot; on some machines reading straight into large, freshly
// faulted memory is several times slower), then into dst.
func (c *Checkpoint) Read(name string, off, shape []int, dst []byte) error {
	return c.read(name, off, shape, dst, true)
}

// ReadChecked is Read for a box whose blocks Check has just verified: it does
// not verify them again (the file is trusted not to change in between).
func (c *Checkpoint) ReadChecked(name string, off, shape []int, dst []byte) error {
	return c.read(name, off, shape, dst, false)
}

func (c *Checkpoint) read(name string, off, shape []int, dst []byte, verify bool) error {
	t, ok := c.Index.Tensors[name]
	if !ok {
		return fmt.Errorf("%w: no tensor %q", ErrMismatch, name)
	}
	es := c.DType(name).Size()
	if len(off) != len(t.Shape) || len(shape) != len(t.Shape) || len(dst) != tensor.NumElements(shape)*es {
		return fmt.Errorf("ckpt: read of %q: box %v+%v into %d bytes, tensor %v", name, off, shape, len(dst), t.Shape)
	}
	want := tensor.Box{Offset: off, Shape: shape}
	for _, b := range t.Boxes {
		fb := b.Bounds()
		region := want.Intersect(fb)
		if region.Empty() {
			continue
		}
		f := c.files[b.File]
		e, _ := f.hdr.Entry(name)
		fh, err := c.fs.Open(f.path)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
		}
		r := &spanReader{c: c, f: f, fh: fh, name: name, trust: !verify}
		// One read per run of the intersection contiguous in both the file box
		// and dst: the whole of it when it is contiguous in both.
		err = tensor.Runs(region, want, fb, func(d, s, n int) error {
			return r.copyOut(dst[d*es:(d+n)*es], e.Begin+int64(s)*int64(es))
		})
		fh.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// spanReader reads a file's data section in verified pieces: whole checksum
// blocks, ioChunk at a time, into a scratch buffer kept between pieces.
type spanReader struct {
	c          *Checkpoint
	f          *openFile
	fh         File
	name       string
	buf        []byte
	start, end int64  // data bytes buf holds
	checked    []bool // per block of buf: verified
	trust      bool   // verified before: do not check again
}

// verify checks the blocks of p, which holds data bytes from pos (a block
// boundary) on.
func (r *spanReader) verify(p []byte, pos int64) error {
	if r.f.info == nil || r.trust {
		return nil
	}
	for o := 0; o < len(p); o += BlockSize {
		blk := p[o:min(o+BlockSize, len(p))]
		b := (pos + int64(o)) / BlockSize
		if got, want := crc32.Checksum(blk, castagnoli), r.f.info.Blocks[b]; got != want {
			return fmt.Errorf("%w: %s: tensor %q: block %d (data bytes %d-%d) has CRC-32C %08x, the index says %08x",
				ErrCorrupt, r.f.path, r.name, b, b*BlockSize, b*BlockSize+int64(len(blk)), got, want)
		}
	}
	return nil
}

func (r *spanReader) readAt(p []byte, pos int64) error {
	if _, err := r.fh.ReadAt(p, r.f.hdr.DataStart+pos); err != nil {
		return fmt.Errorf("%w: %s: reading tensor %q: %v", ErrFormat, r.f.path, r.name, err)
	}
	return nil
}

// copyOut copies data bytes [pos, pos+len(p)) into p through the scratch
// buffer, loading the chunks they lie in and verifying the blocks they touch.
func (r *spanReader) copyOut(p []byte, pos int64) error {
	return r.walk(pos, pos+int64(len(p)), func(chunk []byte, at int64) {
		copy(p[at-pos:], chunk)
	})
}

// walk loads data bytes [pos, end) chunk by chunk into the scratch buffer,
// verifies the blocks they touch, and hands each piece (and its data offset)
// to f, if f is not nil.
func (r *spanReader) walk(pos, end int64, f func(piece []byte, at int64)) error {
	for pos < end {
		if pos < r.start || pos >= r.end {
			cs := pos / ioChunk * ioChunk
			ce := min(cs+ioChunk, r.f.hdr.DataLen)
			if r.buf == nil {
				r.buf = make([]byte, ioChunk)
				r.checked = make([]bool, ioChunk/BlockSize)
			}
			if err := r.readAt(r.buf[:ce-cs], cs); err != nil {
				return err
			}
			clear(r.checked)
			r.start, r.end = cs, ce
		}
		n := min(end, r.end) - pos
		for b := (pos - r.start) / BlockSize; b <= (pos-r.start+n-1)/BlockSize; b++ {
			if !r.checked[b] {
				lo := b * BlockSize
				if err := r.verify(r.buf[lo:min(lo+BlockSize, r.end-r.start)], r.start+lo); err != nil {
					return err
				}
				r.checked[b] = true
			}
		}
		if f != nil {
			f(r.buf[pos-r.start:pos-r.start+n], pos)
		}
		pos += n
	}
	return nil
}

// Check verifies, without keeping any of it, the data Read of the same box
// would read: every checksum block it touches (through one scratch buffer).
func (c *Checkpoint) Check(name string, off, shape []int) error {
	t, ok := c.Index.Tensors[name]
	if !ok {
		return fmt.Errorf("%w: no tensor %q", ErrMismatch, name)
	}
	es := int64(c.DType(name).Size())
	if len(off) != len(t.Shape) || len(shape) != len(t.Shape) {
		return fmt.Errorf("ckpt: check of %q: box %v+%v, tensor %v", name, off, shape, t.Shape)
	}
	want := tensor.Box{Offset: off, Shape: shape}
	for _, b := range t.Boxes {
		fb := b.Bounds()
		region := want.Intersect(fb)
		if region.Empty() {
			continue
		}
		f := c.files[b.File]
		if f.info == nil {
			continue
		}
		e, _ := f.hdr.Entry(name)
		fh, err := c.fs.Open(f.path)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
		}
		r := &spanReader{c: c, f: f, fh: fh, name: name}
		first, last := fb.Span(region)
		err = r.walk(e.Begin+int64(first)*es, e.Begin+int64(last)*es, nil)
		fh.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Verify reads every file whole and checks its CRC-32C against the index.
func (c *Checkpoint) Verify() error {
	for _, name := range c.Files() {
		f := c.files[name]
		if f.info == nil {
			continue
		}
		fh, err := c.fs.Open(f.path)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
		}
		h := crc32.New(castagnoli)
		_, err = io.Copy(h, bufio.NewReaderSize(fh, 4<<20))
		fh.Close()
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, err)
		}
		if got := h.Sum32(); got != f.info.CRC32C {
			if err := c.locate(f); err != nil {
				return err
			}
			return fmt.Errorf("%w: %s: CRC-32C %08x, the index says %08x (every data block matches: the header bytes differ)",
				ErrCorrupt, f.path, got, f.info.CRC32C)
		}
	}
	return nil
}

// locate finds the damage in file f, whose CRC-32C failed, block by block:
// the error names the tensor and the block, or is nil when every data block
// matches.
func (c *Checkpoint) locate(f *openFile) error {
	fh, err := c.fs.Open(f.path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
	}
	defer fh.Close()
	for _, e := range f.hdr.Entries {
		r := &spanReader{c: c, f: f, fh: fh, name: e.Name}
		if err := r.walk(e.Begin, e.End, nil); err != nil {
			return err
		}
	}
	return nil
}

// ReadAll returns tensor name whole, as a host tensor.
func (c *Checkpoint) ReadAll(name string) (*tensor.Tensor, error) {
	t, ok := c.Index.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("%w: no tensor %q", ErrMismatch, name)
	}
	out := tensor.New(c.DType(name), t.Shape...)
	return out, c.Read(name, make([]int, len(t.Shape)), t.Shape, tensor.HostBytes(out))
}

// Convert writes checkpoint c as one plain safetensors file at dst (every
// tensor whole, in name order, data verified as it is read), written beside
// dst and renamed into place. meta goes into its __metadata__.
func Convert(fsys FS, c *Checkpoint, dst string, meta map[string]string) (*FileInfo, error) {
	names := c.Names()
	entries := make([]Entry, len(names))
	data := make([][]byte, len(names))
	for i, name := range names {
		t, err := c.ReadAll(name)
		if err != nil {
			return nil, err
		}
		entries[i] = Entry{Name: name, DType: t.DType(), Shape: t.Shape()}
		data[i] = tensor.HostBytes(t)
	}
	tmp := dst + ".tmp"
	info, err := WriteFile(fsys, tmp, entries, data, meta)
	if err != nil {
		return nil, err
	}
	if err := fsys.Rename(tmp, dst); err != nil {
		return nil, err
	}
	return info, fsys.SyncDir(parentDir(dst))
}
