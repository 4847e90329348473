package tensor

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

const npyMagic = "\x93NUMPY"

// maxNpyElements bounds what ReadNpy will allocate (2^31 elements).
const maxNpyElements = 1 << 31

// WriteNpy writes a host tensor in NumPy's .npy format (version 1.0, little endian,
// C order). NumPy has no bfloat16: a bfloat16 tensor is written as float32
// (exactly: every bfloat16 is a float32), and read back as float32; Convert
// narrows it again.
func (t *Tensor) WriteNpy(w io.Writer) error {
	if t.buf != nil {
		return fmt.Errorf("%w: WriteNpy of a %v tensor", ErrDevice, t.Device())
	}
	if t.dtype == BFloat16 {
		f, err := Convert(t, Float32)
		if err != nil {
			return err
		}
		return f.WriteNpy(w)
	}
	descr := "<f4"
	if t.dtype == Float64 {
		descr = "<f8"
	}
	var sh strings.Builder
	sh.WriteByte('(')
	for i, d := range t.shape {
		if i > 0 {
			sh.WriteString(", ")
		}
		sh.WriteString(strconv.Itoa(d))
	}
	if len(t.shape) == 1 {
		sh.WriteByte(',')
	}
	sh.WriteByte(')')
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, sh.String())
	// Pad so that magic(6)+version(2)+len(2)+header ends on a 64-byte boundary with '\n'.
	total := 10 + len(header) + 1
	pad := (64 - total%64) % 64
	header += strings.Repeat(" ", pad) + "\n"
	version := []byte{1, 0}
	var hlen []byte
	if len(header) > math.MaxUint16 {
		version = []byte{2, 0}
		total = 12 + len(header)
		header = strings.TrimRight(header, " \n")
		pad = (64 - (12+len(header)+1)%64) % 64
		header += strings.Repeat(" ", pad) + "\n"
		hlen = binary.LittleEndian.AppendUint32(nil, uint32(len(header)))
	} else {
		hlen = binary.LittleEndian.AppendUint16(nil, uint16(len(header)))
	}
	bw := bufio.NewWriter(w)
	bw.WriteString(npyMagic)
	bw.Write(version)
	bw.Write(hlen)
	bw.WriteString(header)
	var scratch [8]byte
	switch t.dtype {
	case Float32:
		for _, v := range t.f32 {
			binary.LittleEndian.PutUint32(scratch[:4], math.Float32bits(v))
			bw.Write(scratch[:4])
		}
	case Float64:
		for _, v := range t.f64 {
			binary.LittleEndian.PutUint64(scratch[:], math.Float64bits(v))
			bw.Write(scratch[:])
		}
	default:
		return fmt.Errorf("%w: %v", ErrDType, t.dtype)
	}
	return bw.Flush()
}

// ReadNpy decodes a .npy stream holding a little- or big-endian float32 or float64
// array in C order.
func ReadNpy(r io.Reader) (*Tensor, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, fmt.Errorf("%w: short preamble: %v", ErrFormat, err)
	}
	if string(pre[:6]) != npyMagic {
		return nil, fmt.Errorf("%w: bad magic", ErrFormat)
	}
	var hlen int
	switch pre[6] {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("%w: short header length: %v", ErrFormat, err)
		}
		hlen = int(binary.LittleEndian.Uint16(b[:]))
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("%w: short header length: %v", ErrFormat, err)
		}
		hlen = int(binary.LittleEndian.Uint32(b[:]))
	default:
		return nil, fmt.Errorf("%w: version %d.%d", ErrFormat, pre[6], pre[7])
	}
	if hlen > 1<<20 {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrFormat, hlen)
	}
	hb := make([]byte, hlen)
	if _, err := io.ReadFull(r, hb); err != nil {
		return nil, fmt.Errorf("%w: short header: %v", ErrFormat, err)
	}
	h, err := parseNpyHeader(string(hb))
	if err != nil {
		return nil, err
	}
	if h.fortran {
		return nil, fmt.Errorf("%w: fortran order is not supported", ErrFormat)
	}
	var dt DType
	var order binary.ByteOrder = binary.LittleEndian
	switch h.descr {
	case "<f4", "=f4", "f4":
		dt = Float32
	case ">f4":
		dt, order = Float32, binary.BigEndian
	case "<f8", "=f8", "f8":
		dt = Float64
	case ">f8":
		dt, order = Float64, binary.BigEndian
	default:
		return nil, fmt.Errorf("%w: descr %q", ErrDType, h.descr)
	}
	n := 1
	for _, d := range h.shape {
		if d < 0 || (d > 0 && n > maxNpyElements/d) {
			return nil, fmt.Errorf("%w: shape %v", ErrFormat, h.shape)
		}
		n *= d
	}
	t := &Tensor{shape: h.shape, dtype: dt}
	// Read in chunks so that a lying header cannot make us allocate much before the
	// data runs out.
	const chunk = 1 << 16
	raw := make([]byte, min(n, chunk)*dt.Size())
	if dt == Float32 {
		t.f32 = make([]float32, 0, min(n, chunk))
	} else {
		t.f64 = make([]float64, 0, min(n, chunk))
	}
	for done := 0; done < n; {
		m := min(n-done, chunk)
		b := raw[:m*dt.Size()]
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("%w: data: %v", ErrFormat, err)
		}
		if dt == Float32 {
			for i := 0; i < m; i++ {
				t.f32 = append(t.f32, math.Float32frombits(order.Uint32(b[4*i:])))
			}
		} else {
			for i := 0; i < m; i++ {
				t.f64 = append(t.f64, math.Float64frombits(order.Uint64(b[8*i:])))
			}
		}
		done += m
	}
	if t.f32 == nil && dt == Float32 {
		t.f32 = []float32{}
	}
	return t, nil
}

// Load reads a .npy file.
func Load(path string) (*Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := ReadNpy(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Save writes a host tensor to a .npy file.
func (t *Tensor) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := t.WriteNpy(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

type npyHeader struct {
	descr   string
	fortran bool
	shape   []int
}

// parseNpyHeader parses the Python dict literal of a .npy header, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
func parseNpyHeader(s string) (npyHeader, error) {
	var h npyHeader
	p := &hdrParser{s: strings.TrimRight(s, " \n\r\t\x00")}
	bad := func(what string) (npyHeader, error) {
		return npyHeader{}, fmt.Errorf("%w: header %q: %s", ErrFormat, s, what)
	}
	if !p.eat('{') {
		return bad("want '{'")
	}
	seen := map[string]bool{}
	for {
		if p.eat('}') {
			break
		}
		key, ok := p.str()
		if !ok {
			return bad("want a quoted key")
		}
		if seen[key] {
			return bad("duplicate key " + key)
		}
		seen[key] = true
		if !p.eat(':') {
			return bad("want ':'")
		}
		switch key {
		case "descr":
			v, ok := p.str()
			if !ok {
				return bad("descr is not a string")
			}
			h.descr = v
		case "fortran_order":
			switch {
			case p.word("True"):
				h.fortran = true
			case p.word("False"):
				h.fortran = false
			default:
				return bad("fortran_order is not a bool")
			}
		case "shape":
			sh, ok := p.tuple()
			if !ok {
				return bad("shape is not a tuple of ints")
			}
			h.shape = sh
		default:
			return bad("unknown key " + key)
		}
		if !p.eat(',') {
			if !p.eat('}') {
				return bad("want ',' or '}'")
			}
			break
		}
	}
	p.skip()
	if p.i != len(p.s) {
		return bad("trailing bytes")
	}
	if !seen["descr"] || !seen["fortran_order"] || !seen["shape"] {
		return bad("missing key")
	}
	return h, nil
}

type hdrParser struct {
	s string
	i int
}

func (p *hdrParser) skip() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

func (p *hdrParser) eat(c byte) bool {
	p.skip()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *hdrParser) word(w string) bool {
	p.skip()
	if strings.HasPrefix(p.s[p.i:], w) {
		p.i += len(w)
		return true
	}
	return false
}

func (p *hdrParser) str() (string, bool) {
	p.skip()
	if p.i >= len(p.s) || (p.s[p.i] != '\'' && p.s[p.i] != '"') {
		return "", false
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", false
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, true
}

func (p *hdrParser) tuple() ([]int, bool) {
	if !p.eat('(') {
		return nil, false
	}
	shape := []int{}
	for {
		if p.eat(')') {
			return shape, true
		}
		p.skip()
		j := p.i
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		if j == p.i || j-p.i > 12 {
			return nil, false
		}
		d, err := strconv.Atoi(p.s[p.i:j])
		if err != nil {
			return nil, false
		}
		p.i = j
		shape = append(shape, d)
		if !p.eat(',') {
			if !p.eat(')') {
				return nil, false
			}
			return shape, true
		}
	}
}
