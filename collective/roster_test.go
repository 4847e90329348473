package collective

import (
	"reflect"
	"testing"
)

func TestRosterWire(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Roster
	}{
		{"error", Roster{Error: "missing ranks [3] (3 of 4 joined)"}},
		{"empty", Roster{}},
		{"two hosts", Roster{Secret: []byte{1, 2, 3}, Ranks: []Announce{
			{Rank: 0, Size: 3, Host: "a", Boot: "b1", PID: 10, Nonce: "n0", Addr: "10.0.0.1:5000", Shm: "s0"},
			{Rank: 1, Size: 3, Host: "a", Boot: "b1", PID: 11, Nonce: "n1", Addr: "10.0.0.1:5001"},
			{Rank: 2, Size: 3, Host: "c", PID: 1 << 30, Nonce: "n2"},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRoster(encodeRoster(tc.r))
			if err != nil || !reflect.DeepEqual(got, tc.r) {
				t.Fatalf("round trip: %+v, %v; want %+v", got, err, tc.r)
			}
		})
	}
}

func FuzzDecodeRoster(f *testing.F) {
	f.Add(encodeRoster(Roster{Error: "x"}))
	f.Add(encodeRoster(Roster{Secret: []byte("k"), Ranks: []Announce{{Size: 2, Host: "h", Nonce: "a"}, {Rank: 1, Size: 2, Host: "h", Nonce: "b", Addr: "x:1"}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRoster(b)
		if err != nil {
			return
		}
		again, err := decodeRoster(encodeRoster(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding %+v: %+v, %v", r, again, err)
		}
	})
}
