package bootstrap_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/transport"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// stranger opens connections to a data port that never authenticate: idle
// ones (connect, send nothing), garbage ones (random bytes), and ones that
// speak the protocol for job, claiming rank claim, but cannot answer the
// challenge. It keeps them open until close.
type stranger struct {
	mu    sync.Mutex
	conns []net.Conn
	dials int // connections the kernel accepted
	fails int // refused
}

func (s *stranger) flood(addr, job string, claim uint32, idle, garbage int) {
	hello := make([]byte, 4+8+4+4+32)
	copy(hello, "MRT1")
	h := fnv.New64a()
	h.Write([]byte("job:" + job))
	binary.LittleEndian.PutUint64(hello[4:], h.Sum64())
	binary.LittleEndian.PutUint32(hello[12:], claim)
	binary.LittleEndian.PutUint32(hello[16:], claim-1)
	for i := 0; i < idle+garbage; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		s.mu.Lock()
		if err != nil {
			s.fails++
			s.mu.Unlock()
			continue
		}
		s.dials++
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		if i < idle {
			continue
		}
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		switch i % 3 {
		case 0:
			junk := make([]byte, 200)
			rand.Read(junk)
			c.Write(junk)
		case 1:
			c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		case 2:
			rand.Read(hello[20:])
			c.Write(hello)
			c.Write(make([]byte, 32)) // a wrong answer to the challenge
		}
	}
}

func (s *stranger) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

// listeners returns the ports of the TCP sockets this process listens on.
func listeners(t *testing.T) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, f := range procNetTCP(t) {
		if f.state == "0A" && inodes[f.inode] {
			ports[f.port] = true
		}
	}
	return ports
}

// newListener waits until this process listens on a port not in known, adds
// it to known and returns it.
func newListener(t *testing.T, known map[int]bool) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for p := range listeners(t) {
			if !known[p] {
				known[p] = true
				return p
			}
		}
	}
	t.Fatal("no new listener")
	return 0
}

type tcpSocket struct {
	port         int // local
	state, inode string
}

func procNetTCP(t *testing.T) []tcpSocket {
	var out []tcpSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !strings.Contains(fs[1], ":") {
				continue
			}
			p, err := strconv.ParseUint(fs[1][strings.LastIndexByte(fs[1], ':')+1:], 16, 16)
			if err == nil {
				out = append(out, tcpSocket{port: int(p), state: fs[3], inode: fs[9]})
			}
		}
		fh.Close()
	}
	return out
}

// closeWait counts the sockets in CLOSE-WAIT whose local port is port.
func closeWait(t *testing.T, port int) int {
	n := 0
	for _, s := range procNetTCP(t) {
		if s.port == port && s.state == "08" {
			n++
		}
	}
	return n
}

func portOf(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// TestTCPStrangerFlood: a world of 3 over tcp whose data ports are flooded
// with connections that never authenticate — idle, garbage, and ones that
// claim to be a rank but fail the challenge.
//
// (a) During the rendezvous and setup: 200 idle and 200 garbage connections
// wait in rank 1's accept queue before rank 2 (which rank 1 accepts) has even
// joined, and more arrive while the ranks connect; every rank joins and
// all-reduces right, and rank 1 logs the strangers in at most a few lines.
// (b) Mid-job, between collectives: the same flood at every rank's data port;
// the job goes on. (c) Then no socket of a rank's data port is in CLOSE-WAIT,
// and, after the job, no goroutine is left.
func TestTCPStrangerFlood(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	rdv := bootstraptest.WatchRendezvous(t, s)
	leak := collectivetest.Goroutines(t)
	core, logs := observer.New(zap.InfoLevel)
	o := collective.Options{Logger: zap.New(core)}
	cfgs := make([]bootstrap.Config, 3)
	for i := range cfgs {
		cfgs[i] = bootstraptest.Config(s, job, i, 3, "tcp", o)
		cfgs[i].RendezvousTimeout = 20 * time.Second
	}
	ws := make([]*collective.World, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	join := func(r int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[r], errs[r] = bootstrap.Join(context.Background(), cfgs[r])
		}()
	}
	known := listeners(t)
	join(0)
	newListener(t, known)
	join(1)
	addr1 := net.JoinHostPort("127.0.0.1", strconv.Itoa(newListener(t, known)))
	var setup stranger
	defer setup.close()
	setup.flood(addr1, job, 2, 200, 200)
	if setup.dials < 400 {
		t.Fatalf("the stranger got %d of 400 connections into rank 1's accept queue", setup.dials)
	}
	join(2)
	flooding := make(chan struct{})
	go func() { // more while the ranks connect
		defer close(flooding)
		setup.flood(addr1, job, 2, 50, 50)
	}()
	wg.Wait()
	<-flooding
	defer func() {
		for _, w := range ws {
			if w != nil {
				w.Close()
			}
		}
	}()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: join: %v", r, err)
		}
	}
	if err := bootstraptest.AllReduceOnce(ws); err != nil {
		t.Fatal(err)
	}
	setup.close()
	lines := logs.FilterMessageSnippet("did not authenticate").FilterField(zap.Int("rank", 1)).All()
	if len(lines) == 0 || len(lines) > 3 {
		t.Errorf("rank 1 logged %d lines about the strangers, want 1 to 3", len(lines))
	} else if all := lines[len(lines)-1].ContextMap()["closed_in_all"]; all.(int64) < 400 {
		t.Errorf("rank 1 says it closed %d strangers' connections, want at least 400", all)
	}

	// (b) Mid-job.
	roster := rdv.RosterSeen(t)
	var mid stranger
	defer mid.close()
	for round := 0; round < 3; round++ {
		for r := 0; r < 3; r++ {
			mid.flood(roster.Ranks[r].Addr, job, 2, 70, 70)
		}
		if err := bootstraptest.AllReduceOnce(ws); err != nil {
			t.Fatalf("after mid-job flood %d: %v", round, err)
		}
	}
	// What got through to a port is closed by the rank at once.
	mid.mu.Lock()
	for _, c := range mid.conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil || n > 0 {
			t.Errorf("a stranger's mid-job connection to %s is open (read %d bytes, %v)", c.RemoteAddr(), n, err)
			break
		}
	}
	mid.mu.Unlock()
	t.Logf("mid-job: %d connections accepted by the kernel, %d refused", mid.dials, mid.fails)
	mid.close()

	// (c) Nothing in CLOSE-WAIT on any data port, during the job and after.
	time.Sleep(100 * time.Millisecond)
	for r, a := range roster.Ranks {
		if n := closeWait(t, portOf(t, a.Addr)); n > 0 {
			t.Errorf("rank %d: %d sockets of its data port %s in CLOSE-WAIT", r, n, a.Addr)
		}
	}
	if err := bootstraptest.AllReduceOnce(ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		w.Close()
	}
	for r, a := range roster.Ranks {
		if n := closeWait(t, portOf(t, a.Addr)); n > 0 {
			t.Errorf("after the job, rank %d: %d sockets of its data port in CLOSE-WAIT", r, n)
		}
	}
	rdv.Close()
	leak()
}

// TestTCPSetupFloodInnocentRank: the case that used to fail a job and blame
// its rank 0: silent connections to rank 0's data port before and while the
// transports connect (rank 2 a second late). Every rank connects; none is
// blamed.
func TestTCPSetupFloodInnocentRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leak := collectivetest.Goroutines(t)
	secret := []byte("this job's secret, 32 bytes long")
	lns := make([]net.Listener, 3)
	addrs := make([]string, 3)
	for i := range lns {
		ln, err := transport.TCPListen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	var st stranger
	defer st.close()
	st.flood(addrs[0], "job-f", 1, 150, 50)
	trs := make([]collective.Transport, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range trs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r == 2 {
				st.flood(addrs[0], "job-f", 2, 50, 50)
				time.Sleep(time.Second)
			}
			trs[r], errs[r] = transport.NewTCPTransport(ctx, r, 3, lns[r], addrs, secret, "job-f", nil)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	st.close()
	ctls := collective.LocalControls(3)
	ws := make([]*collective.World, 3)
	for i, tr := range trs {
		if tr == nil {
			t.FailNow()
		}
		w, err := collective.NewWorld(tr, ctls[i], collective.Options{Job: "job-f"})
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	err := bootstraptest.AllReduceOnce(ws)
	for _, w := range ws {
		w.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := closeWait(t, portOf(t, addrs[0])); n > 0 {
		t.Errorf("%d sockets of rank 0's data port in CLOSE-WAIT", n)
	}
	leak()
}
