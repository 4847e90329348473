package bootstrap

import (
	"context"
	"net"
	"net/url"
	"strings"
	"time"
)

// dataHost is the address the tcp data listener of a rank of a job on several
// nodes binds when MESHRUN_TCP_HOST is not set: an address of this machine
// that hostname resolves to, not loopback (what the peers dialed when the host
// name was announced), else the address this machine reaches the NATS server
// from (a connected UDP socket: no packet is sent), not loopback. Empty when
// neither exists.
func dataHost(hostname, natsURL string) string {
	usable := func(ip net.IP) bool {
		return ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast()
	}
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				local[n.IP.String()] = true
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, hostname)
	cancel()
	if err == nil {
		for _, ip := range ips {
			if usable(ip.IP) && local[ip.IP.String()] {
				return ip.IP.String()
			}
		}
	}
	for _, u := range strings.Split(natsURL, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Hostname() == "" {
			continue
		}
		port := pu.Port()
		if port == "" {
			port = "4222"
		}
		c, err := net.Dial("udp", net.JoinHostPort(pu.Hostname(), port))
		if err != nil {
			continue
		}
		ip := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		if usable(ip) {
			return ip.String()
		}
	}
	return ""
}
