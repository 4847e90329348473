package collective

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/meshrun/meshrun/tensor"
)

// HeaderSize is the fixed size of every message header on every transport.
const HeaderSize = 80

// Version of the wire format.
const wireVersion = 2

const magic = 0x4d524331 // "MRC1"

// MaxPayload is the declared bound of one message's payload: no decoder accepts
// (or allocates for) a longer one.
const MaxPayload = 16 << 20

// Op identifies a collective on the wire.
type Op uint8

const (
	OpNone Op = iota
	OpAllReduce
	OpAllGather
	OpReduceScatter
	OpAllToAll
	OpBroadcast
	OpBarrier
	OpSend
	OpCreate
	opMax
)

var opNames = [...]string{"none", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier", "send", "create_group"}

func (o Op) String() string {
	if o < opMax {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// dnone is the dtype byte of collectives that move no data (barrier, group
// creation); the others carry tensor.DType's value.
const dnone tensor.DType = 0

func dtypeName(d tensor.DType) string {
	if d == dnone {
		return "none"
	}
	return d.String()
}

// Header is the fixed binary header carried by every message. The first seven
// fields describe the collective (and must agree across the group); the rest
// locate the message within it.
//
// Layout (little endian, 80 bytes):
//
//	0  magic   u32   "MRC1"
//	4  version u8
//	5  op      u8
//	6  dtype   u8
//	7  redop   u8
//	8  job     u64   hash of the job id
//	16 group   u64   hash of the group's ranks
//	24 seq     u64   collective sequence number within the group
//	32 src     i32   sending world rank
//	36 dst     i32   receiving world rank
//	40 count   u64   elements of the collective (op-specific, e.g. buffer length)
//	48 shape   u64   hash of the per-rank counts and root
//	56 step    u32   algorithm step
//	60 chunk   u32   chunk index within the step
//	64 offset  u64   element offset of the chunk
//	72 length  u32   payload bytes following the header
//	76 check   u32   FNV-1a over the words of bytes 0..75 (see checksum)
type Header struct {
	Op     Op
	DType  tensor.DType
	RedOp  uint8
	Job    uint64
	Group  uint64
	Seq    uint64
	Src    int32
	Dst    int32
	Count  uint64
	Shape  uint64
	Step   uint32
	Chunk  uint32
	Offset uint64
	Length uint32
}

// Encode writes h into b[:HeaderSize].
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	b[4] = wireVersion
	b[5] = byte(h.Op)
	b[6] = byte(h.DType)
	b[7] = h.RedOp
	le.PutUint64(b[8:], h.Job)
	le.PutUint64(b[16:], h.Group)
	le.PutUint64(b[24:], h.Seq)
	le.PutUint32(b[32:], uint32(h.Src))
	le.PutUint32(b[36:], uint32(h.Dst))
	le.PutUint64(b[40:], h.Count)
	le.PutUint64(b[48:], h.Shape)
	le.PutUint32(b[56:], h.Step)
	le.PutUint32(b[60:], h.Chunk)
	le.PutUint64(b[64:], h.Offset)
	le.PutUint32(b[72:], h.Length)
	le.PutUint32(b[76:], checksum(b[:76]))
}

// checksum is FNV-1a taken a little-endian word at a time (nine 8-byte
// words and the last 4 bytes of the 76), folded to 32 bits: each step is a
// bijection of the state for a given word, so any one changed word changes
// the 64-bit state, at an eighth of the byte-wise cost.
func checksum(b []byte) uint32 {
	_ = b[75]
	le := binary.LittleEndian
	h := uint64(14695981039346656037)
	for i := 0; i < 72; i += 8 {
		h ^= le.Uint64(b[i:])
		h *= 1099511628211
	}
	h ^= uint64(le.Uint32(b[72:]))
	h *= 1099511628211
	return uint32(h ^ h>>32)
}

var (
	errShort    = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "short header"}
	errMagic    = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "bad magic"}
	errVersion  = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "unknown wire version"}
	errChecksum = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "header checksum"}
	errOp       = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "unknown op or dtype"}
	errLength   = &Error{Kind: ErrCorrupt, Rank: -1, Reporter: -1, Detail: "payload longer than the declared bound"}
)

// DecodeHeader parses b[:HeaderSize]. It validates magic, version, checksum, op,
// dtype and that the payload length is at most maxPayload (and MaxPayload). It
// never allocates.
func DecodeHeader(b []byte, maxPayload int) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, errShort
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != magic {
		return h, errMagic
	}
	if b[4] != wireVersion {
		return h, errVersion
	}
	if le.Uint32(b[76:]) != checksum(b[:76]) {
		return h, errChecksum
	}
	h.Op = Op(b[5])
	h.DType = tensor.DType(b[6])
	h.RedOp = b[7]
	if h.Op == OpNone || h.Op >= opMax || (h.DType != dnone && !h.DType.Valid()) || h.RedOp > 3 {
		return h, errOp
	}
	h.Job = le.Uint64(b[8:])
	h.Group = le.Uint64(b[16:])
	h.Seq = le.Uint64(b[24:])
	h.Src = int32(le.Uint32(b[32:]))
	h.Dst = int32(le.Uint32(b[36:]))
	h.Count = le.Uint64(b[40:])
	h.Shape = le.Uint64(b[48:])
	h.Step = le.Uint32(b[56:])
	h.Chunk = le.Uint32(b[60:])
	h.Offset = le.Uint64(b[64:])
	h.Length = le.Uint32(b[72:])
	if maxPayload > MaxPayload || maxPayload <= 0 {
		maxPayload = MaxPayload
	}
	if int64(h.Length) > int64(maxPayload) {
		return h, errLength
	}
	return h, nil
}

// DecodeMessage splits one message (header + payload) in b. The payload is a
// sub-slice of b (no copy). Trailing bytes are an error.
func DecodeMessage(b []byte, maxPayload int) (Header, []byte, error) {
	h, err := DecodeHeader(b, maxPayload)
	if err != nil {
		return h, nil, err
	}
	if len(b)-HeaderSize != int(h.Length) {
		return h, nil, errLength
	}
	return h, b[HeaderSize:], nil
}

// Descriptor renders the fields that must agree across a group.
func (h *Header) Descriptor() string {
	red := ""
	if h.Op == OpAllReduce || h.Op == OpReduceScatter {
		red = "(" + ReduceOp(h.RedOp).String() + ")"
	}
	return fmt.Sprintf("%s%s %s count=%d shape=%016x seq=%d group=%016x", h.Op, red, dtypeName(h.DType), h.Count, h.Shape, h.Seq, h.Group)
}

// CheckHeader compares a received header with the one the receiver expects. A
// disagreement on the collective is ErrMismatch with both descriptors; on the
// message's place within it, ErrMismatch as a protocol error.
func CheckHeader(want, got *Header) error {
	if got.Job != want.Job {
		return &Error{Kind: ErrMismatch, Rank: int(got.Src), Reporter: int(want.Dst), Detail: fmt.Sprintf("message from another job (%016x, want %016x)", got.Job, want.Job)}
	}
	if got.Src != want.Src || got.Dst != want.Dst {
		return &Error{Kind: ErrMismatch, Rank: int(got.Src), Reporter: int(want.Dst), Detail: fmt.Sprintf("message %d->%d on link %d->%d", got.Src, got.Dst, want.Src, want.Dst)}
	}
	if got.Op != want.Op || got.DType != want.DType || got.RedOp != want.RedOp || got.Group != want.Group ||
		got.Seq != want.Seq || got.Count != want.Count || got.Shape != want.Shape {
		return &Error{Kind: ErrMismatch, Rank: int(got.Src), Reporter: int(want.Dst), Op: want.Op.String(), Seq: want.Seq,
			Want: want.Descriptor(), Got: got.Descriptor()}
	}
	if got.Step != want.Step || got.Chunk != want.Chunk || got.Offset != want.Offset || got.Length != want.Length {
		return &Error{Kind: ErrMismatch, Rank: int(got.Src), Reporter: int(want.Dst), Op: want.Op.String(), Seq: want.Seq,
			Detail: fmt.Sprintf("protocol: got step %d chunk %d offset %d length %d, want step %d chunk %d offset %d length %d",
				got.Step, got.Chunk, got.Offset, got.Length, want.Step, want.Chunk, want.Offset, want.Length)}
	}
	return nil
}

// hash64 hashes ints (group ranks, counts) for headers.
// JobHash is the hash of job id job that every header carries (Header.Job),
// and that a transport's handshake may check to keep jobs apart.
func JobHash(job string) uint64 { return hash64("job:" + job) }

func hash64(tag string, xs ...[]int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(tag))
	var b [8]byte
	for _, s := range xs {
		binary.LittleEndian.PutUint64(b[:], uint64(len(s)))
		h.Write(b[:])
		for _, x := range s {
			binary.LittleEndian.PutUint64(b[:], uint64(x))
			h.Write(b[:])
		}
	}
	return h.Sum64()
}

// hashCounts hashes counts without allocating.
func hashCounts(root int, counts []int) uint64 {
	h := uint64(14695981039346656037)
	mix := func(x uint64) {
		for i := 0; i < 8; i++ {
			h ^= x & 0xff
			h *= 1099511628211
			x >>= 8
		}
	}
	mix(uint64(root))
	for _, c := range counts {
		mix(uint64(c))
	}
	return h
}
