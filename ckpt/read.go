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
	for _, b := range t.Boxes {
		lo, hi, ok := intersect(off, shape, b.Offset, b.Shape)
		if !ok {
			continue
		}
		f := c.files[b.File]
		e, _ := f.hdr.Entry(name)
		fh, err := c.fs.Open(f.path)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
		}
		r := &spanReader{c: c, f: f, fh: fh, name: name, trust: !verify}
		// The intersection's first and last elements, in the file box and in dst.
		last := dec(hi)
		sFirst, sLast := flat(b.Shape, b.Offset, lo), flat(b.Shape, b.Offset, last)
		dFirst, dLast := flat(shape, off, lo), flat(shape, off, last)
		count := tensor.NumElements(sub(hi, lo))
		start := e.Begin + int64(sFirst)*int64(es)
		if sLast-sFirst+1 == count && dLast-dFirst+1 == count {
			err = r.copyOut(dst[dFirst*es:(dLast+1)*es], start)
		} else {
			err = copyRuns(dst, off, shape, b.Offset, b.Shape, lo, hi, es, func(p []byte, fileElem int) error {
				return r.copyOut(p, e.Begin+int64(fileElem)*int64(es))
			})
		}
		fh.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func dec(hi []int) []int {
	out := make([]int, len(hi))
	for i, v := range hi {
		out[i] = v - 1
	}
	return out
}

func sub(a, b []int) []int {
	out := make([]int, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

// intersect returns the intersection [lo, hi) of two boxes, if not empty.
func intersect(ao, as, bo, bs []int) (lo, hi []int, ok bool) {
	lo, hi = make([]int, len(ao)), make([]int, len(ao))
	for d := range ao {
		lo[d], hi[d] = max(ao[d], bo[d]), min(ao[d]+as[d], bo[d]+bs[d])
		if hi[d] <= lo[d] {
			return nil, nil, false
		}
	}
	return lo, hi, true
}

// flat is the row-major index within a box (shape at off) of global index idx.
func flat(shape, off, idx []int) int {
	i := 0
	for d := range shape {
		i = i*shape[d] + idx[d] - off[d]
	}
	return i
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

// copyRuns walks the elements of the box [lo, hi), one run along the last dim
// at a time, and calls read with the part of dst (the box doff+dshape) the run
// fills and the run's first element's index in the file box soff+sshape.
func copyRuns(dst []byte, doff, dshape, soff, sshape, lo, hi []int, es int, read func(p []byte, fileElem int) error) error {
	nd := len(lo)
	if nd == 0 {
		return read(dst[:es], 0)
	}
	run := (hi[nd-1] - lo[nd-1]) * es
	idx := append([]int(nil), lo...)
	for {
		di := flat(dshape, doff, idx) * es
		if err := read(dst[di:di+run], flat(sshape, soff, idx)); err != nil {
			return err
		}
		d := nd - 2
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return nil
		}
	}
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
	for _, b := range t.Boxes {
		lo, hi, ok := intersect(off, shape, b.Offset, b.Shape)
		if !ok {
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
		start := e.Begin + int64(flat(b.Shape, b.Offset, lo))*es
		end := e.Begin + int64(flat(b.Shape, b.Offset, dec(hi))+1)*es
		err = r.walk(start, end, nil)
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
