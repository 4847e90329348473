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
// the byte span of the intersection, widened to whole checksum blocks, and
// verifies those blocks before using a byte: data that does not match its
// checksum is ErrCorrupt naming the file, the tensor and the block.
func (c *Checkpoint) Read(name string, off, shape []int, dst []byte) error {
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
		// The intersection's first and last elements within the file box.
		first, last := flat(b.Shape, b.Offset, lo), flat(b.Shape, b.Offset, dec(hi))
		start, end := e.Begin+int64(first)*int64(es), e.Begin+int64(last+1)*int64(es)
		src, err := c.readSpan(f, name, start, end)
		if err != nil {
			return err
		}
		// Copy the intersection, run by run along the last dim.
		copyRuns(dst, off, shape, src, b.Offset, b.Shape, lo, hi, es)
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

// readSpan reads data bytes [start, end) of f, widened to whole checksum
// blocks that it verifies, and returns bytes [start, end).
func (c *Checkpoint) readSpan(f *openFile, name string, start, end int64) ([]byte, error) {
	lo, hi := start, end
	if f.info != nil {
		lo = start / BlockSize * BlockSize
		hi = min((end+BlockSize-1)/BlockSize*BlockSize, f.hdr.DataLen)
	}
	buf := make([]byte, hi-lo)
	fh, err := c.fs.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, f.path, missing(err))
	}
	defer fh.Close()
	if _, err := fh.ReadAt(buf, f.hdr.DataStart+lo); err != nil {
		return nil, fmt.Errorf("%w: %s: reading tensor %q: %v", ErrFormat, f.path, name, err)
	}
	if f.info != nil {
		for b := lo; b < hi; b += BlockSize {
			blk := buf[b-lo : min(b-lo+BlockSize, hi-lo)]
			if got, want := crc32.Checksum(blk, castagnoli), f.info.Blocks[b/BlockSize]; got != want {
				return nil, fmt.Errorf("%w: %s: tensor %q: block %d (data bytes %d-%d) has CRC-32C %08x, the index says %08x",
					ErrCorrupt, f.path, name, b/BlockSize, b, b+int64(len(blk)), got, want)
			}
		}
	}
	return buf[start-lo : end-lo], nil
}

// copyRuns copies the elements of the box [lo, hi) into dst (the box
// doff+dshape) from src, the bytes of the file box soff+sshape from its element
// at lo on. Element size es.
func copyRuns(dst []byte, doff, dshape []int, src []byte, soff, sshape, lo, hi []int, es int) {
	nd := len(lo)
	if nd == 0 {
		copy(dst[:es], src[:es])
		return
	}
	first := flat(sshape, soff, lo)
	run := (hi[nd-1] - lo[nd-1]) * es
	idx := append([]int(nil), lo...)
	for {
		si := (flat(sshape, soff, idx) - first) * es
		di := flat(dshape, doff, idx) * es
		copy(dst[di:di+run], src[si:si+run])
		d := nd - 2
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return
		}
	}
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
			return fmt.Errorf("%w: %s: CRC-32C %08x, the index says %08x", ErrCorrupt, f.path, got, f.info.CRC32C)
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
