package launch

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/internal/testpki"
	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/protocol"
)

// testNet is hosts on a real network: one network namespace per host, each
// with its own address on a bridge (veth pairs), its own /etc/hosts (ip
// netns exec mounts /etc/netns/NAME/hosts) and, for what runs in it, its own
// host name (a UTS namespace).
type testNet struct {
	t      *testing.T
	prefix string
	hosts  []netHost
	bridge string
}

type netHost struct {
	ns, name, addr string
	veth           string // the root side of its link
}

// netSubnet is the test network's /24.
const netSubnet = "10.199.77."

func newTestNet(t *testing.T, n int) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command")
	}
	tn := &testNet{t: t, prefix: fmt.Sprintf("mr%04x", os.Getpid()&0xffff)}
	tn.bridge = tn.prefix + "br"
	t.Cleanup(tn.close)
	if err := tn.ip("link", "add", tn.bridge, "type", "bridge"); err != nil {
		t.Skipf("cannot create a bridge here: %v", err)
	}
	tn.must("link", "set", tn.bridge, "up")
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for k := 0; k < n; k++ {
		h := netHost{ns: fmt.Sprintf("%s-%d", tn.prefix, k), name: fmt.Sprintf("host%d", k), addr: fmt.Sprintf("%s%d", netSubnet, k+1),
			veth: fmt.Sprintf("%sv%d", tn.prefix, k)}
		fmt.Fprintf(&hosts, "%s %s\n", h.addr, h.name)
		tn.hosts = append(tn.hosts, h)
	}
	// What this machine does not allow (no network namespaces, no veth, no
	// mount namespace for /etc/netns) skips the test; it is the environment.
	setup := func(args ...string) {
		t.Helper()
		if err := tn.ip(args...); err != nil {
			t.Skipf("cannot build the test network here: %v", err)
		}
	}
	for _, h := range tn.hosts {
		peer := h.veth + "p"
		setup("netns", "add", h.ns)
		setup("link", "add", h.veth, "type", "veth", "peer", "name", peer)
		setup("link", "set", peer, "netns", h.ns)
		setup("link", "set", h.veth, "master", tn.bridge)
		setup("link", "set", h.veth, "up")
		setup("netns", "exec", h.ns, "ip", "link", "set", peer, "name", "eth0")
		setup("netns", "exec", h.ns, "ip", "addr", "add", h.addr+"/24", "dev", "eth0")
		setup("netns", "exec", h.ns, "ip", "link", "set", "eth0", "up")
		setup("netns", "exec", h.ns, "ip", "link", "set", "lo", "up")
		dir := filepath.Join("/etc/netns", h.ns)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Skipf("cannot build the test network here: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			t.Skipf("cannot build the test network here: %v", err)
		}
	}
	if out, err := tn.command(0, "true").CombinedOutput(); err != nil {
		t.Skipf("cannot run a program under its own host name here (ip netns exec, unshare --uts): %v %s", err, out)
	}
	return tn
}

func (tn *testNet) ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (tn *testNet) must(args ...string) {
	tn.t.Helper()
	if err := tn.ip(args...); err != nil {
		tn.t.Fatal(err)
	}
}

func (tn *testNet) close() {
	for _, h := range tn.hosts {
		exec.Command("ip", "netns", "del", h.ns).Run()
		exec.Command("ip", "link", "del", h.veth).Run()
		os.RemoveAll(filepath.Join("/etc/netns", h.ns))
	}
	exec.Command("ip", "link", "del", tn.bridge).Run()
}

// command runs argv on host k: in its network namespace, under its host name.
func (tn *testNet) command(k int, argv ...string) *exec.Cmd {
	h := tn.hosts[k]
	args := append([]string{"netns", "exec", h.ns, "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, h.name}, argv...)
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// natsCluster is one nats-server per host, clustered with routes, TLS for
// clients, one user per job.
type natsCluster struct {
	tn      *testNet
	confs   []string
	servers []*exec.Cmd
	routes  []chan struct{} // closed when a server has its routes
	ca      string
}

func startNATSCluster(t *testing.T, tn *testNet, jobs map[string]creds.Credentials) *natsCluster {
	t.Helper()
	serverBin := buildNATSServer(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "cluster")
	var ips, names, routes, users []string
	for _, h := range tn.hosts {
		ips, names = append(ips, h.addr), append(names, h.name)
		routes = append(routes, fmt.Sprintf("nats-route://%s:6222", h.addr))
	}
	cert, key := ca.IssueFor(t, dir, "server", ips, names)
	for job, c := range jobs {
		subj := fmt.Sprintf(`[%q, "_INBOX.>"]`, protocol.JobSubjects(job))
		users = append(users, fmt.Sprintf(`{ user: %q, password: %q, permissions: { publish: %s, subscribe: %s } }`, c.User, c.Password, subj, subj))
	}
	nc := &natsCluster{tn: tn, ca: ca.File}
	for k, h := range tn.hosts {
		conf := fmt.Sprintf(`server_name: %s
listen: %s:4222
max_payload: 8MB
tls { cert_file: %q, key_file: %q, ca_file: %q }
authorization { users: [
%s
] }
cluster { name: meshrun, listen: %s:6222, routes: [%s] }
`, h.name, h.addr, cert, key, ca.File, strings.Join(users, "\n"), h.addr, strings.Join(routes, ", "))
		f := filepath.Join(dir, fmt.Sprintf("nats-%d.conf", k))
		if err := os.WriteFile(f, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		nc.confs = append(nc.confs, f)
		nc.servers = append(nc.servers, nil)
		nc.routes = append(nc.routes, nil)
	}
	for k := range tn.hosts {
		nc.start(t, k, serverBin)
	}
	nc.waitRoutes(t)
	t.Cleanup(func() {
		for _, s := range nc.servers {
			if s != nil && s.Process != nil {
				syscall.Kill(-s.Process.Pid, syscall.SIGKILL)
				s.Wait()
			}
		}
	})
	return nc
}

// start starts host k's server; its routes channel closes when it has
// routes to every other server.
func (nc *natsCluster) start(t *testing.T, k int, serverBin string) {
	t.Helper()
	cmd := nc.tn.command(k, serverBin, "-c", nc.confs[k])
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	nc.servers[k], nc.routes[k] = cmd, done
	want := len(nc.tn.hosts) - 1
	go func() {
		sc := bufio.NewScanner(stderr)
		n := 0
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Route connection created") {
				if n++; n == want {
					close(done)
				}
			}
		}
	}()
}

func (nc *natsCluster) waitRoutes(t *testing.T) {
	t.Helper()
	for k, c := range nc.routes {
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("nats-server of host %d has no routes to the others", k)
		}
	}
}

// kill kills host k's server.
func (nc *natsCluster) kill(k int) {
	syscall.Kill(-nc.servers[k].Process.Pid, syscall.SIGKILL)
	nc.servers[k].Wait()
}

// netLauncher is a launcher running on one host of a testNet.
type netLauncher struct {
	cmd      *exec.Cmd
	out      syncBuffer
	code     int
	end      time.Time
	done     chan struct{}
	logDir   string
	hostName string
}

// runOnHosts starts one launcher per host for job, each reaching its own
// host's NATS server.
func runOnHosts(t *testing.T, tn *testNet, nc *natsCluster, job string, c creds.Credentials, env []string, workload ...string) []*netLauncher {
	t.Helper()
	credsFile := writeCreds(t, c)
	var ls []*netLauncher
	for k, h := range tn.hosts {
		l := &netLauncher{done: make(chan struct{}), logDir: t.TempDir(), hostName: h.name}
		args := append([]string{filepath.Join(bin, "launcher"), "run", "--nnodes", fmt.Sprint(len(tn.hosts)), "--node-rank", fmt.Sprint(k), "-n", "1",
			"--nats", fmt.Sprintf("tls://%s:4222", h.addr), "--nats-ca", nc.ca, "--nats-creds", credsFile, "--job-id", job,
			"--log-dir", l.logDir, "--grace", "1s"}, workload...)
		l.cmd = tn.command(k, args...)
		l.cmd.Env = append(os.Environ(), env...)
		l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
		if err := l.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			l.cmd.Wait()
			l.code, l.end = l.cmd.ProcessState.ExitCode(), time.Now()
			close(l.done)
		}()
		t.Cleanup(func() {
			select {
			case <-l.done:
			default:
				syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
				<-l.done
			}
		})
		ls = append(ls, l)
	}
	return ls
}

// waitAll waits for every launcher, at most d (scaled: testtime).
func waitAll(t *testing.T, ls []*netLauncher, d time.Duration) {
	t.Helper()
	d = testtime.Scale(d)
	deadline := time.After(d)
	for k, l := range ls {
		select {
		case <-l.done:
		case <-deadline:
			t.Fatalf("the launcher of host %d did not exit within %v:\n%s", k, d, l.out.String())
		}
	}
}

// TestHostsOnANetwork: three hosts, each in its own network namespace with
// its own address, host name and /etc/hosts, joined by a bridge; a NATS
// cluster of one server per host (TLS for clients, routes between them); one
// launcher per host, ranks over the tcp transport. mlp and verify --quick
// pass across the hosts (so every rank announced an address its peers reach,
// never 127.0.0.1); a NATS server killed mid-job ends the job with a typed
// error, never a hang or a wrong result; a host's link taken down mid-job
// ends every launcher within the collective deadline + 2 s naming a rank of
// another host, with no process left behind.
func TestHostsOnANetwork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server, runs a cluster and three launchers")
	}
	tn := newTestNet(t, 3)
	jobs := map[string]creds.Credentials{}
	for _, j := range []string{"net-mlp", "net-verify", "net-master", "net-delay", "net-delay-verify", "net-natskill", "net-linkdown"} {
		jobs[j] = creds.Credentials{User: "u-" + j, Password: "pw-" + j}
	}
	nc := startNATSCluster(t, tn, jobs)
	tcp := []string{"MESHRUN_TRANSPORT=tcp"}

	ok := func(name string, ls []*netLauncher, took time.Duration) {
		t.Helper()
		for k, l := range ls {
			if l.code != 0 {
				t.Fatalf("%s: host %d: exit %d\n%s", name, k, l.code, l.out.String())
			}
			b, _ := os.ReadFile(filepath.Join(l.logDir, name, RankDir(k), "log.jsonl"))
			if !bytes.Contains(b, []byte(`"transport":"tcp"`)) {
				t.Errorf("%s: rank %d did not join over tcp:\n%s", name, k, b)
			}
			// The address it announced is its host's, which its peers reach.
			if want := fmt.Sprintf(`"data_addr":"%s:`, tn.hosts[k].addr); !bytes.Contains(b, []byte(want)) || bytes.Contains(b, []byte(`"data_addr":"127.`)) {
				t.Errorf("%s: rank %d did not announce %s...:\n%s", name, k, want, b)
			}
		}
		t.Logf("%s: 3 hosts, exit 0 in %v", name, took.Round(time.Millisecond))
	}
	start := time.Now()
	ls := runOnHosts(t, tn, nc, "net-mlp", jobs["net-mlp"], tcp, "mlp", "--mesh", "tp=3", "--tokens", "48", "--hidden", "24", "--ffn", "96", "--steps", "20")
	waitAll(t, ls, 60*time.Second)
	ok("net-mlp", ls, time.Since(start))
	start = time.Now()
	ls = runOnHosts(t, tn, nc, "net-verify", jobs["net-verify"], tcp, "verify", "--quick")
	waitAll(t, ls, 120*time.Second)
	ok("net-verify", ls, time.Since(start))

	// torch's env:// address: node 0's address on the network, on every host.
	ls = runOnHosts(t, tn, nc, "net-master", jobs["net-master"], nil, "--", "sh", "-c", `echo "master $MASTER_ADDR:$MASTER_PORT"`)
	waitAll(t, ls, 30*time.Second)
	for k, l := range ls {
		b, _ := os.ReadFile(filepath.Join(l.logDir, "net-master", RankDir(k), "stdout.log"))
		if l.code != 0 || !bytes.Contains(b, []byte("master "+tn.hosts[0].addr+":")) {
			t.Errorf("host %d: exit %d, MASTER_ADDR: %s", k, l.code, b)
		}
	}

	// 5 ms delay and 1% loss between the hosts: with tc netem where the
	// kernel has it, else with a switch in user space (netHub) in place of
	// the bridge.
	how := "tc netem"
	var hub *netHub
	if exec.Command("tc", "qdisc", "add", "dev", tn.hosts[0].veth, "root", "netem", "delay", "5ms", "loss", "1%").Run() == nil {
		for _, h := range tn.hosts[1:] {
			tn.must("qdisc", "add", "dev", h.veth, "root", "netem", "delay", "5ms", "loss", "1%")
		}
	} else {
		how = "a user-space switch (this kernel has no netem)"
		for _, h := range tn.hosts {
			tn.must("link", "set", h.veth, "nomaster")
		}
		hub = startHub(t, tn, 5*time.Millisecond, 0.01)
	}
	start = time.Now()
	ls = runOnHosts(t, tn, nc, "net-delay", jobs["net-delay"], tcp, "mlp", "--mesh", "tp=3", "--tokens", "48", "--hidden", "24", "--ffn", "96", "--steps", "20")
	waitAll(t, ls, 120*time.Second)
	t.Logf("with 5 ms delay and 1%% loss per frame on every link, through %s:", how)
	ok("net-delay", ls, time.Since(start))
	start = time.Now()
	ls = runOnHosts(t, tn, nc, "net-delay-verify", jobs["net-delay-verify"], tcp, "verify", "--quick")
	waitAll(t, ls, 120*time.Second)
	ok("net-delay-verify", ls, time.Since(start))
	if hub != nil {
		hub.stop()
		for _, h := range tn.hosts {
			tn.must("link", "set", h.veth, "master", tn.bridge)
		}
	} else {
		for _, h := range tn.hosts {
			exec.Command("tc", "qdisc", "del", "dev", h.veth, "root").Run()
		}
	}
	nc.waitRoutes(t)

	long := []string{"mlp", "--mesh", "tp=3", "--tokens", "48", "--hidden", "24", "--ffn", "96", "--steps", "1000000"}
	training := func(ls []*netLauncher, job string) {
		t.Helper()
		waitFor(t, 60*time.Second, job+" training", func() bool {
			b, _ := os.ReadFile(filepath.Join(ls[0].logDir, job, RankDir(0), "stdout.log"))
			return bytes.Contains(b, []byte("step 50/"))
		})
	}

	// A NATS server of the cluster killed mid-job: host 1's ranks and
	// launcher lose their control plane; the job ends, typed, no hang.
	ls = runOnHosts(t, tn, nc, "net-natskill", jobs["net-natskill"], tcp, long...)
	training(ls, "net-natskill")
	killed := time.Now()
	nc.kill(1)
	waitAll(t, ls, 60*time.Second)
	for k, l := range ls {
		t.Logf("NATS server of host 1 killed: host %d's launcher exit %d after %v: %s", k, l.code, l.end.Sub(killed).Round(time.Millisecond), finalLine(l.out.String()))
		if l.code == 0 {
			t.Errorf("host %d: exit 0 from a job that cannot have finished", k)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ls[1].logDir, "net-natskill", RankDir(1), "stderr.log")); !bytes.Contains(b, []byte("control plane lost")) &&
		!bytes.Contains(b, []byte("NATS")) {
		t.Errorf("host 1's rank does not say it lost NATS:\n%s", b)
	}
	nc.start(t, 1, buildNATSServer(t))
	nc.waitRoutes(t)

	// Host 2's link down mid-job.
	t.Setenv("MESHRUN_COLLECTIVE_TIMEOUT", "5s")
	deadline := 5 * time.Second
	ls = runOnHosts(t, tn, nc, "net-linkdown", jobs["net-linkdown"], append(tcp, "MESHRUN_COLLECTIVE_TIMEOUT=5s"), long...)
	training(ls, "net-linkdown")
	down := time.Now()
	tn.must("link", "set", tn.hosts[2].veth, "down")
	waitAll(t, ls, 60*time.Second)
	for k, l := range ls {
		took := l.end.Sub(down)
		last := finalLine(l.out.String())
		t.Logf("host 2's link down: host %d's launcher exit %d after %v: %s", k, l.code, took.Round(time.Millisecond), last)
		if l.code == 0 || took > deadline+testtime.Scale(2*time.Second+2*time.Second) /* teardown: abort, SIGTERM, --grace 1s */ {
			t.Errorf("host %d: exit %d after %v", k, l.code, took)
		}
		other := "node 2"
		if k == 2 {
			other = "node " // host 2 names a rank of one of the hosts it lost
		}
		if !strings.Contains(last, other) || (k == 2 && strings.Contains(last, "(node 2")) {
			t.Errorf("host %d does not name the unreachable side: %s", k, last)
		}
	}
	if n := tagged(); n != 0 {
		t.Errorf("%d processes of the jobs left", n)
	}
}

// tagged counts live processes that carry a launcher's tag.
func tagged() int {
	return soakCounts().tagged
}

// buildNATSServer builds nats-server from the module (once per test binary).
func buildNATSServer(t *testing.T) string {
	t.Helper()
	natsServerOnce.Do(func() {
		natsServerBin = filepath.Join(bin, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsServerBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsServerErr = fmt.Errorf("building nats-server: %v\n%s", err, out)
		}
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
	return natsServerBin
}

// netHub is an Ethernet switch in user space between the hosts' links (their
// root-side veths, taken off the bridge): it repeats every frame a host sends
// to the other hosts after delay, dropping a fraction loss of them — what tc
// netem does, for kernels without it. Raw packet sockets with
// PACKET_VNET_HDR keep the kernel's checksum and segmentation offload data
// with each frame, so frames leave as they came.
type netHub struct {
	fds  []int
	quit chan struct{}
	wg   sync.WaitGroup
}

// packetVnetHdr is Linux's PACKET_VNET_HDR socket option.
const packetVnetHdr = 15

func startHub(t *testing.T, tn *testNet, delay time.Duration, loss float64) *netHub {
	t.Helper()
	h := &netHub{quit: make(chan struct{})}
	proto := int(htons(syscall.ETH_P_ALL))
	var idx []int
	for _, host := range tn.hosts {
		ifc, err := net.InterfaceByName(host.veth)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, proto)
		if err == nil {
			err = syscall.SetsockoptInt(fd, syscall.SOL_PACKET, packetVnetHdr, 1)
		}
		if err == nil {
			err = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &syscall.Timeval{Usec: 100000})
		}
		if err == nil {
			err = syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_ALL), Ifindex: ifc.Index})
		}
		if err != nil {
			t.Fatalf("packet socket on %s: %v", host.veth, err)
		}
		h.fds, idx = append(h.fds, fd), append(idx, ifc.Index)
	}
	type frame struct {
		b   []byte
		due time.Time
	}
	rng := rand.New(rand.NewSource(1))
	var rngMu sync.Mutex
	for i := range h.fds {
		q := make(chan frame, 1<<14)
		h.wg.Add(2)
		go func() { // read what host i sends
			defer h.wg.Done()
			defer close(q)
			buf := make([]byte, 1<<17)
			for {
				select {
				case <-h.quit:
					return
				default:
				}
				n, from, err := syscall.Recvfrom(h.fds[i], buf, 0)
				if err != nil {
					continue // the read timeout: look at quit
				}
				if ll, ok := from.(*syscall.SockaddrLinklayer); ok && ll.Pkttype == syscall.PACKET_OUTGOING {
					continue // what this switch sent
				}
				rngMu.Lock()
				drop := rng.Float64() < loss
				rngMu.Unlock()
				if !drop {
					q <- frame{append([]byte(nil), buf[:n]...), time.Now().Add(delay)}
				}
			}
		}()
		go func() { // and pass it on, in order, once it is due
			defer h.wg.Done()
			for f := range q {
				time.Sleep(time.Until(f.due))
				for j := range h.fds {
					if j != i {
						syscall.Sendto(h.fds[j], f.b, 0, &syscall.SockaddrLinklayer{Ifindex: idx[j]})
					}
				}
			}
		}()
	}
	return h
}

func (h *netHub) stop() {
	close(h.quit)
	h.wg.Wait()
	for _, fd := range h.fds {
		syscall.Close(fd)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
