package bootstrap

import (
	"net"
	"testing"
)

// TestDataHost: without MESHRUN_TCP_HOST, a rank of a job on several nodes
// binds an address of this machine, never loopback (peers on other machines
// could not reach it), and every interface only when it finds none.
func TestDataHost(t *testing.T) {
	var own string // a non-loopback address of this machine
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			own = n.IP.String()
			break
		}
	}
	for _, tc := range []struct {
		name, host, nats, want string
		needOwn                bool
	}{
		{"loopback only", "localhost", "nats://127.0.0.1:4222", "", false},
		{"route to nats", "localhost", "nats://" + own + ":4222", own, true},
		{"second nats url", "localhost", "nats://127.0.0.1:1, tls://" + own, own, true},
		{"host name's address", own, "nats://127.0.0.1:4222", own, true},
		{"garbled url", "localhost", "::", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needOwn && own == "" {
				t.Skip("no non-loopback IPv4 address on this machine")
			}
			if got := dataHost(tc.host, tc.nats); got != tc.want {
				t.Errorf("dataHost(%q, %q) = %q, want %q", tc.host, tc.nats, got, tc.want)
			}
		})
	}
}
