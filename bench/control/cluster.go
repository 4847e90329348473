package main

// The servers a job's simulated ranks connect to: the embedded one (natsrv,
// the default), or -cluster K nats-server processes on loopback (Debian's
// package: apt-get install nats-server), joined by routes when K > 1, with the
// users and permissions natsrv gives a job (an admin with every subject, the
// job's user with meshrun.<job>.> and _INBOX.> only) and natsrv's write
// deadline. Rank r connects to server r mod K.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/natsrv"
)

// counts are a job's servers' counters, summed over its servers.
type counts struct {
	// Client traffic: what the ranks (and the admin) published and were
	// delivered. A cluster's /varz counts the messages on its routes too
	// (a message from a client of server A to one of server B is in and out of
	// both); those are subtracted here (/routez) and kept in RouteMsgs.
	InMsgs, OutMsgs, InBytes, OutBytes int64
	RouteMsgs, RouteBytes              int64 // in + out on every route
	SlowConsumers                      int64
	CPU                                time.Duration // the server processes' CPU time (cluster only)
	Conns                              []int         // client connections per server
}

type server interface {
	// URL is the server rank connects to.
	URL(rank int) string
	Admin() creds.Credentials
	Credentials(job string) (creds.Credentials, bool)
	Stats() (counts, error)
	Shutdown()
}

type embedded struct{ *natsrv.Server }

func (e embedded) URL(int) string { return e.Server.URL() }

func (e embedded) Stats() (counts, error) {
	st, err := e.Server.Stats()
	return counts{InMsgs: st.InMsgs, OutMsgs: st.OutMsgs, InBytes: st.InBytes, OutBytes: st.OutBytes,
		SlowConsumers: st.SlowConsumers, Conns: []int{st.Connections}}, err
}

// natsServerPath is the nats-server binary -cluster runs.
var natsServerPath string

// checkNATSServer finds the nats-server binary (on PATH, else in /usr/sbin,
// where Debian's package puts it) and reports its version, or why -cluster
// cannot run.
func checkNATSServer() (string, error) {
	path, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr != nil {
			return "", fmt.Errorf("-cluster needs the nats-server binary, on PATH or in /usr/sbin (Debian: apt-get install nats-server): %v", err)
		}
		path = "/usr/sbin/nats-server"
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", path, err, out)
	}
	natsServerPath = path
	return strings.TrimSpace(string(out)), nil
}

type clusterServer struct {
	dir     string
	clients []int // client port per server
	monitor []int // monitoring port per server
	procs   []*exec.Cmd
	exited  []chan struct{}
	admin   creds.Credentials
	job     string
	jobCr   creds.Credentials
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// startCluster starts k nats-server processes for job and waits until each
// accepts connections and (k > 1) has a route to every other.
func startCluster(k int, job string) (_ *clusterServer, err error) {
	dir, err := os.MkdirTemp("", "ctlbench-nats-")
	if err != nil {
		return nil, err
	}
	c := &clusterServer{dir: dir, job: job,
		admin: creds.Credentials{User: "admin-" + randomHex(4), Password: randomHex(24)},
		jobCr: creds.Credentials{User: "job-" + randomHex(6), Password: randomHex(24)}}
	defer func() {
		if err != nil {
			c.Shutdown()
		}
	}()
	ports, err := freePorts(3 * k)
	if err != nil {
		return nil, err
	}
	c.clients, c.monitor = ports[:k], ports[k:2*k]
	routes := ports[2*k:]
	routeUser, routePass := "route-"+randomHex(4), randomHex(24)
	for i := 0; i < k; i++ {
		conf := filepath.Join(dir, fmt.Sprintf("server%d.conf", i))
		if err := os.WriteFile(conf, c.config(i, routes, routeUser, routePass), 0o600); err != nil {
			return nil, err
		}
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("server%d.log", i)))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(natsServerPath, "-c", conf)
		cmd.Stdout, cmd.Stderr = logf, logf
		// The servers die with this process (run.sh stops a size with SIGKILL).
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("starting nats-server: %v", err)
		}
		logf.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		c.procs, c.exited = append(c.procs, cmd), append(c.exited, done)
	}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < k; i++ {
		for {
			var rz struct {
				NumRoutes int `json:"num_routes"`
			}
			err := c.get(i, "/routez", &rz)
			if err == nil && rz.NumRoutes >= k-1 {
				break
			}
			select {
			case <-c.exited[i]:
				return nil, fmt.Errorf("nats-server %d exited: %s", i, c.logTail(i))
			default:
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("nats-server %d: not ready with %d routes within 20 s (%v): %s", i, k-1, err, c.logTail(i))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

// config is server i's configuration file.
func (c *clusterServer) config(i int, routes []int, routeUser, routePass string) []byte {
	q := strconv.Quote // the strings are ASCII: hex, digits, "meshrun.<job>.>"
	allow := q(natsrv.JobSubjects(c.job)) + ", " + q("_INBOX.>")
	var b bytes.Buffer
	fmt.Fprintf(&b, "server_name: %s\nhost: 127.0.0.1\nport: %d\nhttp: %s\n", q(fmt.Sprintf("ctlbench-%d", i)), c.clients[i], q(fmt.Sprintf("127.0.0.1:%d", c.monitor[i])))
	b.WriteString("write_deadline: \"10s\"\n") // natsrv's
	fmt.Fprintf(&b, "authorization {\n  users: [\n    {user: %s, password: %s}\n", q(c.admin.User), q(c.admin.Password))
	fmt.Fprintf(&b, "    {user: %s, password: %s, permissions: {publish: {allow: [%s]}, subscribe: {allow: [%s]}}}\n  ]\n}\n",
		q(c.jobCr.User), q(c.jobCr.Password), allow, allow)
	if len(routes) > 1 {
		fmt.Fprintf(&b, "cluster {\n  name: \"ctlbench\"\n  host: 127.0.0.1\n  port: %d\n", routes[i])
		fmt.Fprintf(&b, "  authorization {user: %s, password: %s}\n  routes: [\n", q(routeUser), q(routePass))
		for j, p := range routes {
			if j != i {
				fmt.Fprintf(&b, "    %s\n", q(fmt.Sprintf("nats-route://%s:%s@127.0.0.1:%d", routeUser, routePass, p)))
			}
		}
		b.WriteString("  ]\n}\n")
	}
	return b.Bytes()
}

func (c *clusterServer) logTail(i int) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("server%d.log", i)))
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

// problems summarizes the servers' warnings and errors so far: each message
// (numbers blanked) with how many times it was logged.
func (c *clusterServer) problems() string {
	num := regexp.MustCompile(`[0-9]+`)
	seen := map[string]int{}
	var order []string
	for i := range c.procs {
		b, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("server%d.log", i)))
		for _, l := range strings.Split(string(b), "\n") {
			k := strings.Index(l, "[WRN]")
			if k < 0 {
				k = strings.Index(l, "[ERR]")
			}
			if k < 0 {
				continue
			}
			m := num.ReplaceAllString(l[k:], "N")
			if seen[m] == 0 {
				order = append(order, m)
			}
			seen[m]++
		}
	}
	var out []string
	for _, m := range order {
		out = append(out, fmt.Sprintf("%d× %s", seen[m], m))
	}
	return strings.Join(out, "; ")
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// get reads monitoring endpoint path of server i into v.
func (c *clusterServer) get(i int, path string, v any) error {
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d%s", c.monitor[i], path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func (c *clusterServer) URL(rank int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.clients[rank%len(c.clients)])
}

func (c *clusterServer) Admin() creds.Credentials { return c.admin }

func (c *clusterServer) Credentials(job string) (creds.Credentials, bool) {
	return c.jobCr, job == c.job
}

func (c *clusterServer) Stats() (counts, error) {
	var s counts
	for i := range c.procs {
		var vz struct {
			Connections   int   `json:"connections"`
			InMsgs        int64 `json:"in_msgs"`
			OutMsgs       int64 `json:"out_msgs"`
			InBytes       int64 `json:"in_bytes"`
			OutBytes      int64 `json:"out_bytes"`
			SlowConsumers int64 `json:"slow_consumers"`
		}
		var rz struct {
			Routes []struct {
				InMsgs   int64 `json:"in_msgs"`
				OutMsgs  int64 `json:"out_msgs"`
				InBytes  int64 `json:"in_bytes"`
				OutBytes int64 `json:"out_bytes"`
			} `json:"routes"`
		}
		if err := c.get(i, "/varz", &vz); err != nil {
			return s, fmt.Errorf("server %d: %v", i, err)
		}
		if err := c.get(i, "/routez", &rz); err != nil {
			return s, fmt.Errorf("server %d: %v", i, err)
		}
		s.InMsgs += vz.InMsgs
		s.OutMsgs += vz.OutMsgs
		s.InBytes += vz.InBytes
		s.OutBytes += vz.OutBytes
		s.SlowConsumers += vz.SlowConsumers
		s.Conns = append(s.Conns, vz.Connections)
		for _, r := range rz.Routes {
			s.InMsgs -= r.InMsgs
			s.OutMsgs -= r.OutMsgs
			s.InBytes -= r.InBytes
			s.OutBytes -= r.OutBytes
			s.RouteMsgs += r.InMsgs + r.OutMsgs
			s.RouteBytes += r.InBytes + r.OutBytes
		}
		s.CPU += procCPU(c.procs[i].Process.Pid)
	}
	return s, nil
}

// procCPU is a process's user + system CPU time (/proc/<pid>/stat, in ticks of
// 1/100 s).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// Shutdown stops the servers (SIGTERM, then SIGKILL after 5 s) and removes
// their files.
func (c *clusterServer) Shutdown() {
	for _, p := range c.procs {
		p.Process.Signal(syscall.SIGTERM)
	}
	for i, p := range c.procs {
		select {
		case <-c.exited[i]:
		case <-time.After(5 * time.Second):
			p.Process.Kill()
			<-c.exited[i]
		}
	}
	c.procs = nil
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}
