package bootstrap

import (
	"reflect"
	"testing"

	"github.com/meshrun/meshrun/collective"
)

func TestRosterWire(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    collective.Roster
	}{
		{"error", collective.Roster{Error: "missing ranks [3] (3 of 4 joined)"}},
		{"empty", collective.Roster{}},
		{"two hosts", collective.Roster{Secret: []byte{1, 2, 3}, Ranks: []collective.Announce{
			{Rank: 0, Size: 3, Host: "a", Boot: "b1", PID: 10, Nonce: "n0", Addr: "10.0.0.1:5000", Shm: "s0"},
			{Rank: 1, Size: 3, Host: "a", Boot: "b1", PID: 11, Nonce: "n1", Addr: "10.0.0.1:5001"},
			{Rank: 2, Size: 3, Host: "c", PID: 1 << 30, Nonce: "n2"},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeRoster(encodeRoster(tc.r))
			if err != nil || !reflect.DeepEqual(got, tc.r) {
				t.Fatalf("round trip: %+v, %v; want %+v", got, err, tc.r)
			}
		})
	}
}

func FuzzDecodeRoster(f *testing.F) {
	f.Add(encodeRoster(collective.Roster{Error: "x"}))
	f.Add(encodeRoster(collective.Roster{Secret: []byte("k"), Ranks: []collective.Announce{{Size: 2, Host: "h", Nonce: "a"}, {Rank: 1, Size: 2, Host: "h", Nonce: "b", Addr: "x:1"}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRoster(b)
		if err != nil {
			return
		}
		again, err := DecodeRoster(encodeRoster(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding %+v: %+v, %v", r, again, err)
		}
	})
}

// TestRosterChunks: a roster larger than max_payload travels in chunks and is
// reassembled whole, whatever the order; chunks of another coordinator reset it.
func TestRosterChunks(t *testing.T) {
	data := make([]byte, 5000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	chunks := rosterChunks("n1", data, 2000)
	if len(chunks) < 3 {
		t.Fatalf("%d chunks of a 5000-byte roster at max_payload 2000", len(chunks))
	}
	var p rosterParts
	p.add(rosterChunks("other", data, 2000)[0])
	for i := len(chunks) - 1; i >= 0; i-- {
		got, ok := p.add(chunks[i])
		if ok != (i == 0) {
			t.Fatalf("chunk %d: complete %v", i, ok)
		}
		if ok && !reflect.DeepEqual(got, data) {
			t.Fatal("reassembled roster differs")
		}
	}
}
