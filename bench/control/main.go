// Command control measures meshrun's control plane at scale: N simulated ranks
// in one process, each running package collective's real Join (its own NATS
// connection, the rendezvous, heartbeats, failure notices and abort handling;
// transport "none", so no data plane), against one embedded NATS server
// (natsrv), or with -cluster K against K nats-server processes on loopback
// joined by routes, rank r connected to server r mod K (see cluster.go). It
// prints one JSON line per N:
//
//	rendezvous_s    the last rank's Join started -> the last Join returned (connect +
//	                rendezvous); with -start-rate the ranks start evenly over
//	                ramp_s = N / rate
//	msgs_per_s      server messages in + out per second at steady state
//	                (natsrv.Stats, i.e. /varz in_msgs/out_msgs deltas over -window;
//	                with -cluster, each server's /varz summed, less what its
//	                /routez counts on the routes: the clients' traffic)
//	bytes_per_s     the same in bytes
//	route_msgs_per_s, route_bytes_per_s
//	                -cluster: messages (bytes) in + out on the routes, summed
//	                over the servers (each routed message counts out of one
//	                server and into another)
//	cpu_cores       CPU time over the window / its length: this process (the
//	                ranks, and the embedded server), plus with -cluster the
//	                server processes, which server_cpu_cores gives apart
//	detect_s        one rank's NATS socket closed abruptly (as SIGKILL would) ->
//	                every other rank's World failed (ErrPeerLost naming it)
//	abort_s         an abort published on the job's abort subject (a second job of
//	                N ranks) -> every rank's World failed with ErrAborted
//
// The ranks of a job are placed 8 to a simulated node (LOCAL_RANK = rank mod 8).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
)

type options struct {
	ranks        []int
	perNode      int
	window       time.Duration
	warmup       time.Duration
	rdvTimeout   time.Duration
	hbInterval   time.Duration
	hbTimeout    time.Duration
	maxHeapBytes uint64
	skipAbort    bool
	abortOnly    bool
	ramp         time.Duration
	cluster      int
	// serverVersion: nats-server --version with -cluster
	serverVersion string
}

// Result is one JSON line.
type Result struct {
	Ranks         int     `json:"ranks"`
	Servers       int     `json:"servers"`
	ServerVersion string  `json:"server_version,omitempty"`
	ServerConns   []int   `json:"server_conns,omitempty"` // client connections per server at steady state
	RampS         float64 `json:"ramp_s,omitempty"`
	RendezvousS   float64 `json:"rendezvous_s"`
	Joined        int     `json:"joined"`
	MsgsPerS      float64 `json:"msgs_per_s"`
	InMsgsPerS    float64 `json:"in_msgs_per_s"`
	OutMsgsPerS   float64 `json:"out_msgs_per_s"`
	BytesPerS     float64 `json:"bytes_per_s"`
	RouteMsgsPerS float64 `json:"route_msgs_per_s,omitempty"`
	RouteBytesPS  float64 `json:"route_bytes_per_s,omitempty"`
	CPUCores      float64 `json:"cpu_cores"` // CPU time / wall time over the window
	ServerCPU     float64 `json:"server_cpu_cores,omitempty"`
	SlowConsumers int64   `json:"slow_consumers"`
	FalseFailures int     `json:"false_failures"` // ranks failed before any fault was injected
	DetectS       float64 `json:"detect_s"`
	DetectFirstS  float64 `json:"detect_first_s"`
	DetectNamed   int     `json:"detect_named"` // ranks whose error names the killed rank
	AbortS        float64 `json:"abort_s"`
	AbortRdvS     float64 `json:"abort_job_rendezvous_s"`
	HeartbeatS    float64 `json:"heartbeat_timeout_s"`
	Error         string  `json:"error,omitempty"`
	WallS         float64 `json:"wall_s"`
	PeakHeapMiB   uint64  `json:"peak_heap_mib"`
	Load1         string  `json:"load1"`
}

// dialer opens each simulated rank's NATS connection and keeps it, so that
// kill can close it abruptly.
type dialer struct {
	mu   sync.Mutex
	conn net.Conn
}

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, 10*time.Second)
	if err == nil {
		d.mu.Lock()
		d.conn = c
		d.mu.Unlock()
	}
	return c, err
}

func (d *dialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		if tc, ok := d.conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // RST, as the kernel does for a killed process with unread data
		}
		d.conn.Close()
	}
}

type job struct {
	srv     server
	name    string
	worlds  []*collective.World
	dialers []*dialer
	joinErr error
	errs    map[string]int // join errors by message, rank numbers blanked
	joined  int
	rdv     time.Duration
	stopped bool
}

func startJob(ctx context.Context, o options, n int, tag string) (*job, error) {
	name := fmt.Sprintf("ctlbench-%s-%d-%d", tag, n, time.Now().UnixNano())
	var srv server
	if o.cluster > 0 {
		c, err := startCluster(o.cluster, name)
		if err != nil {
			return nil, err
		}
		srv = c
	} else {
		s, err := natsrv.Start(natsrv.Options{Jobs: []string{name}})
		if err != nil {
			return nil, err
		}
		srv = embedded{s}
	}
	cr, _ := srv.Credentials(name)
	j := &job{srv: srv, name: name, worlds: make([]*collective.World, n), dialers: make([]*dialer, n), errs: map[string]int{}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	t0 := time.Now()
	for r := 0; r < n; r++ {
		j.dialers[r] = &dialer{}
		cfg := bootstrap.Config{
			Rank: r, WorldSize: n,
			LocalRank: r % o.perNode, LocalWorldSize: o.perNode, NodeRank: r / o.perNode, NNodes: (n + o.perNode - 1) / o.perNode,
			Job: name, NATSURL: srv.URL(r), Creds: &cr, Transport: "none",
			RendezvousTimeout: o.rdvTimeout, HeartbeatInterval: o.hbInterval, HeartbeatTimeout: o.hbTimeout,
			Dialer: j.dialers[r],
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o.ramp > 0 {
				time.Sleep(time.Duration(int64(o.ramp) * int64(cfg.Rank) / int64(n)))
			}
			w, err := bootstrap.Join(ctx, cfg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				j.errs[blankRank(err.Error())]++
				if j.joinErr == nil {
					j.joinErr = fmt.Errorf("rank %d: %w", cfg.Rank, err)
				}
				return
			}
			j.worlds[cfg.Rank] = w
			j.joined++
		}()
	}
	wg.Wait()
	j.rdv = time.Since(t0.Add(o.ramp * time.Duration(n-1) / time.Duration(n)))
	return j, nil
}

// stop closes every rank's connection abruptly first (a clean Close of N
// ranks would publish N closing heartbeats, each to every rank), then the
// worlds and the server.
func (j *job) stop() {
	if j.stopped {
		return
	}
	j.stopped = true
	for _, d := range j.dialers {
		d.kill()
	}
	for _, w := range j.worlds {
		if w != nil {
			w.Close()
		}
	}
	j.srv.Shutdown()
}

// waitFailed polls every world but skip until each has failed or deadline;
// it returns when each failed (zero: never) relative to t0.
func (j *job) waitFailed(t0 time.Time, skip int, deadline time.Duration) []time.Duration {
	at := make([]time.Duration, len(j.worlds))
	left := 0
	for r, w := range j.worlds {
		if r != skip && w != nil {
			left++
		}
	}
	for left > 0 && time.Since(t0) < deadline {
		for r, w := range j.worlds {
			if r == skip || w == nil || at[r] != 0 {
				continue
			}
			if w.Err() != nil {
				at[r] = time.Since(t0)
				left--
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return at
}

// failures counts the worlds' errors by message (rank numbers blanked).
func failures(ws []*collective.World) map[string]int {
	out := map[string]int{}
	for _, w := range ws {
		if w == nil {
			continue
		}
		if err := w.Err(); err != nil {
			out[blankRank(err.Error())]++
		}
	}
	return out
}

// blankRank replaces the rank numbers of an error message with "N", so that
// the same failure of many ranks counts as one message.
func blankRank(s string) string {
	for _, p := range []string{"rank ", "by rank "} {
		for i := 0; ; {
			k := strings.Index(s[i:], p)
			if k < 0 {
				break
			}
			k += i + len(p)
			e := k
			for e < len(s) && s[e] >= '0' && s[e] <= '9' {
				e++
			}
			if e > k {
				s = s[:k] + "N" + s[e:]
			}
			i = k
		}
	}
	return s
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func load1() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func runN(o options, n int) (res Result) {
	start := time.Now()
	res = Result{Ranks: n, Servers: max(o.cluster, 1), ServerVersion: o.serverVersion, RampS: o.ramp.Seconds(), HeartbeatS: o.hbTimeout.Seconds(), Load1: load1()}
	var peak atomic.Uint64
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// A watchdog: the run for this N stops when the heap passes the cap.
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			if o.maxHeapBytes > 0 && ms.HeapAlloc > o.maxHeapBytes {
				cancel(fmt.Errorf("heap %d MiB over the cap after %.1f s", ms.HeapAlloc>>20, time.Since(start).Seconds()))
			}
		}
	}()
	defer func() {
		res.WallS = time.Since(start).Seconds()
		res.PeakHeapMiB = peak.Load() >> 20
		if c := context.Cause(ctx); c != nil && res.Error == "" {
			res.Error = c.Error()
		}
		if len(res.Error) > 2000 {
			res.Error = res.Error[:2000] + "…"
		}
	}()

	measure(ctx, o, n, &res)
	return
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// measure runs job 1 (rendezvous, steady state, detection) and job 2
// (rendezvous, abort) of n ranks; the first problem ends it, in res.Error.
func measure(ctx context.Context, o options, n int, res *Result) {
	if o.abortOnly {
		measureAbort(ctx, o, n, res)
		return
	}
	j, err := startJob(ctx, o, n, "a")
	if err != nil {
		res.Error = err.Error()
		return
	}
	defer j.stop()
	res.RendezvousS, res.Joined = j.rdv.Seconds(), j.joined
	if j.joinErr != nil {
		st, _ := j.srv.Stats()
		res.SlowConsumers = st.SlowConsumers
		res.Error = fmt.Sprintf("join: %v; all join errors: %v", j.joinErr, j.errs)
		if c, ok := j.srv.(*clusterServer); ok {
			res.Error += "; the servers logged: " + c.problems()
		}
		return
	}
	if !sleepCtx(ctx, o.warmup) {
		return
	}
	s0, err := j.srv.Stats()
	c0, t0 := cpuTime(), time.Now()
	if err != nil {
		res.Error = "server stats: " + err.Error()
		return
	}
	if !sleepCtx(ctx, o.window) {
		return
	}
	s1, err := j.srv.Stats()
	c1, el := cpuTime(), time.Since(t0).Seconds()
	if err != nil {
		res.Error = "server stats: " + err.Error()
		return
	}
	res.InMsgsPerS = float64(s1.InMsgs-s0.InMsgs) / el
	res.OutMsgsPerS = float64(s1.OutMsgs-s0.OutMsgs) / el
	res.MsgsPerS = res.InMsgsPerS + res.OutMsgsPerS
	res.BytesPerS = float64(s1.InBytes-s0.InBytes+s1.OutBytes-s0.OutBytes) / el
	res.RouteMsgsPerS = float64(s1.RouteMsgs-s0.RouteMsgs) / el
	res.RouteBytesPS = float64(s1.RouteBytes-s0.RouteBytes) / el
	res.ServerCPU = (s1.CPU - s0.CPU).Seconds() / el
	res.CPUCores = (c1-c0).Seconds()/el + res.ServerCPU
	res.SlowConsumers = s1.SlowConsumers
	res.ServerConns = s1.Conns
	var firstFalse error
	for _, w := range j.worlds {
		if err := w.Err(); err != nil {
			res.FalseFailures++
			if firstFalse == nil {
				firstFalse = err
			}
		}
	}
	if res.FalseFailures > 0 {
		res.Error = fmt.Sprintf("ranks failed with no fault injected: %v; all: %v", firstFalse, failures(j.worlds))
		return
	}

	victim := n / 2
	tk := time.Now()
	j.dialers[victim].kill()
	at := j.waitFailed(tk, victim, o.hbTimeout+30*time.Second)
	var first, last time.Duration
	missing := 0
	for r, d := range at {
		if r == victim {
			continue
		}
		if d == 0 {
			missing++
			continue
		}
		if first == 0 || d < first {
			first = d
		}
		last = max(last, d)
		var ce *collective.Error
		if err := j.worlds[r].Err(); errors.As(err, &ce) && errors.Is(err, collective.ErrPeerLost) && ce.Rank == victim {
			res.DetectNamed++
		}
	}
	res.DetectS, res.DetectFirstS = last.Seconds(), first.Seconds()
	if missing > 0 {
		res.Error = fmt.Sprintf("detect: %d ranks never failed", missing)
		return
	}
	j.stop()
	if o.skipAbort || ctx.Err() != nil {
		return
	}
	runtime.GC()
	sleepCtx(ctx, 3*time.Second) // the first job's connections and goroutines gone
	measureAbort(ctx, o, n, res)
}

// measureAbort runs job 2: rendezvous, then an abort from the admin user.
func measureAbort(ctx context.Context, o options, n int, res *Result) {

	j2, err := startJob(ctx, o, n, "b")
	if err != nil {
		res.Error = err.Error()
		return
	}
	defer j2.stop()
	res.AbortRdvS = j2.rdv.Seconds()
	if j2.joinErr != nil {
		res.Error = "join (abort job): " + j2.joinErr.Error()
		if c, ok := j2.srv.(*clusterServer); ok {
			res.Error += "; the servers logged: " + c.problems()
		}
		return
	}
	if !sleepCtx(ctx, o.warmup) {
		return
	}
	if f := failures(j2.worlds); len(f) > 0 {
		res.Error = fmt.Sprintf("abort job: ranks failed before the abort, with no fault injected: %v", f)
		return
	}
	admin := j2.srv.Admin()
	nc, err := nats.Connect(j2.srv.URL(0), nats.UserInfo(admin.User, admin.Password))
	if err != nil {
		res.Error = "admin connection: " + err.Error()
		return
	}
	defer nc.Close()
	body, _ := json.Marshal(protocol.AbortNotice("bench/control"))
	ta := time.Now()
	nc.Publish(protocol.AbortSubject(j2.name), body)
	nc.Flush()
	at := j2.waitFailed(ta, -1, o.hbTimeout+30*time.Second)
	var last time.Duration
	missing, aborted := 0, 0
	for r, d := range at {
		if d == 0 {
			missing++
			continue
		}
		last = max(last, d)
		if errors.Is(j2.worlds[r].Err(), collective.ErrAborted) {
			aborted++
		}
	}
	res.AbortS = last.Seconds()
	if missing > 0 || aborted < n {
		res.Error = fmt.Sprintf("abort: %d ranks never failed, %d of %d with ErrAborted", missing, aborted, n)
	}
}

func parseRanks(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 2 {
			return nil, fmt.Errorf("-ranks: %q is not a number of ranks >= 2", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func main() {
	var o options
	ranks := flag.String("ranks", "64,256,1024", "numbers of simulated ranks, comma-separated")
	flag.IntVar(&o.perNode, "per-node", 8, "simulated ranks per node")
	flag.DurationVar(&o.window, "window", 10*time.Second, "steady-state measurement window")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "wait after the rendezvous before measuring")
	flag.DurationVar(&o.rdvTimeout, "rendezvous-timeout", 120*time.Second, "Config.RendezvousTimeout (the default of a real job is 30s)")
	flag.DurationVar(&o.hbInterval, "heartbeat-interval", 500*time.Millisecond, "Config.HeartbeatInterval (a real job's default)")
	flag.DurationVar(&o.hbTimeout, "heartbeat-timeout", 5*time.Second, "Config.HeartbeatTimeout (a real job's default)")
	maxHeap := flag.Int("max-heap-mib", 12<<10, "stop a run whose heap passes this many MiB")
	rate := flag.Float64("start-rate", 1000, "start this many ranks a second (as launchers spawning processes would); 0: all at once")
	flag.BoolVar(&o.skipAbort, "skip-abort", false, "measure no abort (saves the second job's rendezvous)")
	flag.BoolVar(&o.abortOnly, "abort-only", false, "run the abort job only (its rendezvous and abort)")
	flag.IntVar(&o.cluster, "cluster", 0, "run each job against this many nats-server processes (a cluster when more than 1; the binary must be on PATH); 0: the embedded server")
	flag.Parse()
	var err error
	if o.cluster < 0 {
		fmt.Fprintln(os.Stderr, "-cluster: want a number of servers >= 0")
		os.Exit(2)
	}
	if o.cluster > 0 {
		if o.serverVersion, err = checkNATSServer(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if o.ranks, err = parseRanks(*ranks); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	o.maxHeapBytes = uint64(*maxHeap) << 20
	enc := json.NewEncoder(os.Stdout)
	for _, n := range o.ranks {
		if *rate > 0 {
			o.ramp = time.Duration(float64(n) / *rate * float64(time.Second))
		}
		enc.Encode(runN(o, n))
	}
}
