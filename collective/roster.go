package collective

import (
	"encoding/binary"
	"errors"
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

func encodeRoster(r Roster) []byte {
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

type rosterReader struct {
	b   []byte
	err bool
}

func (r *rosterReader) uint(limit uint64) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || v > limit {
		r.err = true
		r.b = nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *rosterReader) str() string {
	n := r.uint(uint64(len(r.b)))
	if r.err || n > uint64(len(r.b)) {
		r.err = true
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// decodeRoster reads encodeRoster's form; it never panics and allocates in
// proportion to len(b) only.
func decodeRoster(b []byte) (Roster, error) {
	if len(b) < len(rosterMagic) || string(b[:len(rosterMagic)]) != rosterMagic {
		return Roster{}, errRosterWire
	}
	rd := &rosterReader{b: b[len(rosterMagic):]}
	var r Roster
	r.Error = rd.str()
	if s := rd.str(); s != "" {
		r.Secret = []byte(s)
	}
	size := int(rd.uint(1 << 31))
	ns := rd.uint(uint64(len(rd.b))) // every string takes at least one byte
	if rd.err {
		return Roster{}, errRosterWire
	}
	table := make([]string, ns)
	for i := range table {
		table[i] = rd.str()
	}
	nr := rd.uint(uint64(len(rd.b)) / 6) // an entry takes at least six bytes
	if rd.err {
		return Roster{}, errRosterWire
	}
	if nr > 0 {
		r.Ranks = make([]Announce, nr)
	}
	for i := range r.Ranks {
		a := &r.Ranks[i]
		a.Rank, a.Size = i, size
		h, bt := rd.uint(ns-1), rd.uint(ns-1)
		if rd.err || ns == 0 {
			return Roster{}, errRosterWire
		}
		a.Host, a.Boot = table[h], table[bt]
		a.PID = int(rd.uint(1 << 31))
		a.Nonce, a.Addr, a.Shm = rd.str(), rd.str(), rd.str()
	}
	if rd.err || len(rd.b) != 0 {
		return Roster{}, errRosterWire
	}
	return r, nil
}
