package bootstrap

import (
	"encoding/binary"
	"errors"

	"github.com/meshrun/meshrun/collective"
)

// The roster's wire form, from rank 0 to every rank (RosterSubject). Every
// rank reads every rank's entry, so the roster's size times N is what the
// rendezvous moves: JSON spent ~120 bytes and a few microseconds of decoding
// per entry; this form spends ~30 bytes (no data plane) and no allocation per
// field. Host and boot id, shared by a node's ranks, are written once in a
// string table.
//
//	"MRR1" | error | secret | size | strings: count, each string | ranks: count,
//	each: host index, boot index, pid, nonce, addr, shm
//
// Integers are uvarints; a string is a uvarint length then its bytes.

const rosterMagic = "MRR1"

var errRosterWire = errors.New("bad roster encoding")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func encodeRoster(r collective.Roster) []byte {
	b := []byte(rosterMagic)
	b = appendString(b, r.Error)
	b = appendString(b, string(r.Secret))
	size := 0
	if len(r.Ranks) > 0 {
		size = r.Ranks[0].Size
	}
	b = binary.AppendUvarint(b, uint64(size))
	index := map[string]int{}
	var table []string
	idx := func(s string) int {
		if i, ok := index[s]; ok {
			return i
		}
		index[s] = len(table)
		table = append(table, s)
		return len(table) - 1
	}
	type entry struct{ host, boot int }
	entries := make([]entry, len(r.Ranks))
	for i, a := range r.Ranks {
		entries[i] = entry{idx(a.Host), idx(a.Boot)}
	}
	b = binary.AppendUvarint(b, uint64(len(table)))
	for _, s := range table {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Ranks)))
	for i, a := range r.Ranks {
		b = binary.AppendUvarint(b, uint64(entries[i].host))
		b = binary.AppendUvarint(b, uint64(entries[i].boot))
		b = binary.AppendUvarint(b, uint64(max(a.PID, 0)))
		b = appendString(b, a.Nonce)
		b = appendString(b, a.Addr)
		b = appendString(b, a.Shm)
	}
	return b
}

// rosterReader reads from one string holding the whole roster: every string
// field is a substring of it, so decoding allocates nothing per field.
type rosterReader struct {
	s   string
	err bool
}

func (r *rosterReader) uint(limit uint64) uint64 {
	var v uint64
	for i, shift := 0, uint(0); i < len(r.s) && i < binary.MaxVarintLen64; i, shift = i+1, shift+7 {
		c := r.s[i]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if v > limit || i == binary.MaxVarintLen64-1 && c > 1 {
				break
			}
			r.s = r.s[i+1:]
			return v
		}
	}
	r.err = true
	r.s = ""
	return 0
}

func (r *rosterReader) str() string {
	n := r.uint(uint64(len(r.s)))
	if r.err || n > uint64(len(r.s)) {
		r.err = true
		return ""
	}
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}

// DecodeRoster reads encodeRoster's form; it never panics and allocates in
// proportion to len(b) only.
func DecodeRoster(b []byte) (collective.Roster, error) {
	if len(b) < len(rosterMagic) || string(b[:len(rosterMagic)]) != rosterMagic {
		return collective.Roster{}, errRosterWire
	}
	rd := &rosterReader{s: string(b[len(rosterMagic):])}
	var r collective.Roster
	r.Error = rd.str()
	if s := rd.str(); s != "" {
		r.Secret = []byte(s)
	}
	size := int(rd.uint(1 << 31))
	ns := rd.uint(uint64(len(rd.s))) // every string takes at least one byte
	if rd.err {
		return collective.Roster{}, errRosterWire
	}
	table := make([]string, ns)
	for i := range table {
		table[i] = rd.str()
	}
	nr := rd.uint(uint64(len(rd.s)) / 6) // an entry takes at least six bytes
	if rd.err {
		return collective.Roster{}, errRosterWire
	}
	if nr > 0 {
		r.Ranks = make([]collective.Announce, nr)
	}
	for i := range r.Ranks {
		a := &r.Ranks[i]
		a.Rank, a.Size = i, size
		h, bt := rd.uint(ns-1), rd.uint(ns-1)
		if rd.err || ns == 0 {
			return collective.Roster{}, errRosterWire
		}
		a.Host, a.Boot = table[h], table[bt]
		a.PID = int(rd.uint(1 << 31))
		a.Nonce, a.Addr, a.Shm = rd.str(), rd.str(), rd.str()
	}
	if rd.err || len(rd.s) != 0 {
		return collective.Roster{}, errRosterWire
	}
	return r, nil
}
