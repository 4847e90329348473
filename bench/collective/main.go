// Command collective benchmarks meshrun's collectives against Gloo (PyTorch's
// gloo backend) and Open MPI on this machine, all measured in the same run:
// all-reduce, all-gather and reduce-scatter of float32 from 4 KiB to 64 MiB over
// 2 and 4 processes on loopback, meshrun with its default transport on one host
// (shared memory) and with tcp and nats forced.
//
// It starts an embedded NATS server and spawns the ranks as processes of itself
// with the launcher's environment (RANK, WORLD_SIZE, MESHRUN_JOB_ID, ...). Gloo
// runs gloo_bench.py under Debian's python3-torch; MPI runs mpi_bench.c, compiled
// with mpicc at run time. Every implementation is timed the same way: one
// warm-up call, then 3 repetitions of (barrier, K back-to-back calls), best mean.
//
// Bus bandwidth follows nccl-tests: algbw = S/t with S the buffer size (all-reduce:
// the buffer; all-gather: the gathered output; reduce-scatter: the input), and
// busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for the others.
//
// The rawtcp peer moves the bytes of the ring algorithm over plain loopback
// TCP (rawtcp.go): the ceiling of the tcp transport, in the last column.
//
//	go run ./bench/collective                 # the full table
//	go run ./bench/collective -ranks 2 -max 1M -impls shm,gloo,mpi
//	MESHRUN_BENCH_CPUPROFILE=DIR ...          # a CPU profile per meshrun rank
//	BENCH_TRACE=1 ...                         # the first 2,000 calls of each size, by hundreds
//	BENCH_ITERS=N ...                         # N calls per repetition (meshrun), not 32 MiB's worth
package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/natsrv"
)

//go:embed peers/gloo_bench.py
var glooScript []byte

//go:embed peers/mpi_bench.c
var mpiSource []byte

type result struct {
	Impl  string  `json:"impl"`
	Op    string  `json:"op"`
	Ranks int     `json:"ranks"`
	Bytes int     `json:"bytes"`
	Sec   float64 `json:"sec"`
	Algo  string  `json:"algo"`
}

func itersFor(size int) int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_ITERS")); err == nil && n > 0 {
		return n // a longer loop, for a profile
	}
	return max(3, min(200, (32<<20)/size))
}

func main() {
	if dir := os.Getenv("MESHRUN_BENCH_RAWTCP"); dir != "" {
		if err := rawWorker(dir); err != nil {
			fmt.Fprintln(os.Stderr, "raw tcp worker:", err)
			os.Exit(1)
		}
		return
	}
	if os.Getenv("MESHRUN_BENCH_WORKER") != "" {
		if err := worker(); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		return
	}
	ranksFlag := flag.String("ranks", "2,4", "process counts")
	opsFlag := flag.String("ops", "all_reduce,all_gather,reduce_scatter", "collectives")
	minFlag := flag.String("min", "4K", "smallest size")
	maxFlag := flag.String("max", "64M", "largest size")
	implsFlag := flag.String("impls", "shm,tcp,nats,gloo,mpi,rawtcp", "meshrun transports (shm, tcp, nats) and peers (gloo, mpi, rawtcp: the ring's bytes over plain loopback TCP)")
	python := flag.String("python", "/usr/bin/python3", "python with torch (Debian's python3-torch)")
	jsonOut := flag.String("json", "", "also write every result as JSON lines to this file")
	flag.Parse()
	lo, hi := parseSize(*minFlag), parseSize(*maxFlag)
	var sizes []string
	for s := lo; s <= hi; s *= 4 {
		sizes = append(sizes, strconv.Itoa(s))
	}
	tmp, err := os.MkdirTemp("", "meshrun-bench-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(tmp)
	var all []result
	for _, rs := range strings.Split(*ranksFlag, ",") {
		n, _ := strconv.Atoi(rs)
		for _, impl := range strings.Split(*implsFlag, ",") {
			start := time.Now()
			var res []result
			var err error
			switch impl {
			case "shm", "tcp", "nats":
				res, err = runMeshrun(tmp, n, impl, *opsFlag, strings.Join(sizes, ","))
			case "gloo":
				res, err = runGloo(tmp, *python, n, *opsFlag, strings.Join(sizes, ","))
			case "mpi":
				res, err = runMPI(tmp, n, *opsFlag, strings.Join(sizes, ","))
			case "rawtcp":
				res, err = runRawTCP(tmp, n, *opsFlag, strings.Join(sizes, ","))
			default:
				err = fmt.Errorf("unknown implementation %q", impl)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s over %d ranks: %v (left out of the table)\n", impl, n, err)
			}
			fmt.Fprintf(os.Stderr, "%s over %d ranks: %d results in %v\n", impl, n, len(res), time.Since(start).Round(time.Second))
			all = append(all, res...)
		}
	}
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err == nil {
			for _, r := range all {
				b, _ := json.Marshal(r)
				fmt.Fprintf(f, "%s\n", b)
			}
			f.Close()
		}
	}
	printTable(os.Stdout, all, strings.Split(*implsFlag, ","))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func parseSize(s string) int {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		fatal(fmt.Errorf("size %q", s))
	}
	return n * mult
}

// collect reads result lines from r (other lines go to stderr).
func collect(r io.Reader, out *[]result, done chan<- struct{}) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var res result
		if json.Unmarshal(sc.Bytes(), &res) == nil && res.Impl != "" {
			*out = append(*out, res)
		} else {
			fmt.Fprintln(os.Stderr, sc.Text())
		}
	}
	close(done)
}

func runProcs(cmds []*exec.Cmd, timeout time.Duration) ([]result, error) {
	var res []result
	done := make(chan struct{})
	for i, c := range cmds {
		c.Stderr = os.Stderr
		if i == 0 {
			out, err := c.StdoutPipe()
			if err != nil {
				return nil, err
			}
			go collect(out, &res, done)
		}
		if err := c.Start(); err != nil {
			for _, d := range cmds[:i] {
				d.Process.Kill()
				d.Wait()
			}
			return nil, err
		}
	}
	timer := time.AfterFunc(timeout, func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	})
	defer timer.Stop()
	<-done
	var firstErr error
	for _, c := range cmds {
		if err := c.Wait(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return res, firstErr
}

func runMeshrun(tmp string, n int, transport, ops, sizes string) ([]result, error) {
	job := fmt.Sprintf("bench-%s-%d-%d", transport, n, os.Getpid())
	srv, err := natsrv.Start(natsrv.Options{Jobs: []string{job}})
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	c, _ := srv.Credentials(job)
	path := filepath.Join(tmp, job+".creds")
	if err := creds.Write(path, c); err != nil {
		return nil, err
	}
	return runSelf(n, func(r int) []string {
		env := []string{"MESHRUN_BENCH_WORKER=1", "BENCH_OPS=" + ops, "BENCH_SIZES=" + sizes,
			"LOCAL_RANK=" + strconv.Itoa(r), "LOCAL_WORLD_SIZE=" + strconv.Itoa(n),
			"NODE_RANK=0", "NNODES=1", "MESHRUN_JOB_ID=" + job, "MESHRUN_NATS_URL=" + srv.URL(), "MESHRUN_NATS_CREDS=" + path,
			"MESHRUN_TRANSPORT=" + transport, "MESHRUN_COLLECTIVE_TIMEOUT=120s"}
		if os.Getenv("GOMAXPROCS") == "" {
			// The cores shared out among the ranks, as launcher run does:
			// with 2 ranks on 2 cores, 2 Ps per rank made 4 KiB all-gathers
			// take 2.5-14 us a call against 2-3 us with 1.
			env = append(env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/n)))
		}
		return env
	})
}

// runSelf runs n ranks as processes of this binary, each with RANK and
// WORLD_SIZE and the variables env gives it, and collects their results.
func runSelf(n int, env func(rank int) []string) ([]result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, n)
	for r := range cmds {
		cmds[r] = exec.Command(self)
		cmds[r].Env = append(append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n)), env(r)...)
	}
	return runProcs(cmds, 20*time.Minute)
}

func worker() error {
	if dir := os.Getenv("MESHRUN_BENCH_CPUPROFILE"); dir != "" {
		// One CPU profile per rank: MESHRUN_BENCH_CPUPROFILE=DIR writes DIR/rank-K.prof.
		f, err := os.Create(filepath.Join(dir, "rank-"+os.Getenv("RANK")+".prof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	w, err := bootstrap.Join(ctx, bootstrap.EnvConfig())
	if err != nil {
		return err
	}
	defer w.Close()
	c, err := w.WorldGroup(ctx)
	if err != nil {
		return err
	}
	n, k := w.Size(), w.Rank()
	impl := "meshrun-" + w.Transport().Name()
	for _, op := range strings.Split(os.Getenv("BENCH_OPS"), ",") {
		for _, s := range strings.Split(os.Getenv("BENCH_SIZES"), ",") {
			size, _ := strconv.Atoi(s)
			elems := size / 4
			per := elems / n
			counts := make([]int, n)
			for i := range counts {
				counts[i] = per
			}
			// The buffers a collective reads from peers come from the
			// shared-memory arena where the transport has one (as a program
			// allocates the tensors it communicates); BENCH_HEAP=1 uses
			// make, through the rings.
			var shared [][]float32
			alloc := func(m int) []float32 {
				if os.Getenv("BENCH_HEAP") == "" {
					if b, err := collective.AllocShared[float32](w, m); err == nil {
						shared = append(shared, b)
						return b
					}
				}
				return make([]float32, m)
			}
			// The previous size's buffers are garbage now: collect them and
			// give their pages back before this size is timed, as the C
			// peers free() theirs. Left to the runtime's background
			// scavenger, returning 64 MiB buffers ran beside the next size's
			// first thousand calls: 4 KiB calls took 11-26 µs instead of 2.
			debug.FreeOSMemory()
			var call func() error
			switch op {
			case "all_reduce":
				buf := alloc(elems)
				call = func() error { return collective.AllReduce(ctx, c, buf, collective.Sum) }
			case "all_gather":
				in, out := alloc(per), make([]float32, per*n)
				call = func() error { return collective.AllGather(ctx, c, in, out, counts) }
			case "reduce_scatter":
				in, out := alloc(per*n), make([]float32, per)
				call = func() error { return collective.ReduceScatter(ctx, c, in, out, counts, collective.Sum) }
			default:
				return fmt.Errorf("unknown op %q", op)
			}
			if err := call(); err != nil {
				return err
			}
			// BENCH_TRACE=1: rank 0 prints the mean time of each of the
			// first 20 hundreds of calls after the warm-up (what the first
			// calls pay that later ones do not).
			if os.Getenv("BENCH_TRACE") != "" && k == 0 {
				var line []string
				for w := 0; w < 20; w++ {
					t0 := time.Now()
					for i := 0; i < 100; i++ {
						call()
					}
					line = append(line, fmt.Sprint(time.Since(t0).Microseconds()/100))
				}
				fmt.Fprintf(os.Stderr, "trace %s %d: %s\n", op, size, strings.Join(line, " "))
			} else if os.Getenv("BENCH_TRACE") != "" {
				for i := 0; i < 2000; i++ {
					call()
				}
			}
			best, err := timeCalls(size, func() error { return c.Barrier(ctx) }, call)
			if err != nil {
				return err
			}
			if k == 0 {
				b, _ := json.Marshal(result{Impl: impl, Op: op, Ranks: n, Bytes: size, Sec: best, Algo: c.Algorithm()})
				fmt.Printf("%s\n", b)
			}
			for _, b := range shared {
				collective.FreeShared(w, b)
			}
		}
	}
	return c.Barrier(ctx)
}

// timeCalls times call the same way for every implementation: 3 repetitions
// of (barrier, itersFor(size) back-to-back calls), and returns the best mean
// in seconds. The caller has made the warm-up call.
func timeCalls(size int, barrier, call func() error) (float64, error) {
	iters := itersFor(size)
	best := 1e30
	for rep := 0; rep < 3; rep++ {
		if err := barrier(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		for i := 0; i < iters; i++ {
			if err := call(); err != nil {
				return 0, err
			}
		}
		best = min(best, time.Since(t0).Seconds()/float64(iters))
	}
	return best, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

func runGloo(tmp, python string, n int, ops, sizes string) ([]result, error) {
	script := filepath.Join(tmp, "gloo_bench.py")
	if err := os.WriteFile(script, glooScript, 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, n)
	for r := range cmds {
		cmd := exec.Command(python, script)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "MASTER_PORT="+port,
			"OPS="+ops, "SIZES="+sizes, "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1")
		cmds[r] = cmd
	}
	return runProcs(cmds, 20*time.Minute)
}

func runMPI(tmp string, n int, ops, sizes string) ([]result, error) {
	src := filepath.Join(tmp, "mpi_bench.c")
	bin := filepath.Join(tmp, "mpi_bench")
	if _, err := os.Stat(bin); err != nil {
		if err := os.WriteFile(src, mpiSource, 0o644); err != nil {
			return nil, err
		}
		if out, err := exec.Command("mpicc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("mpicc: %v: %s", err, out)
		}
	}
	cmd := exec.Command("mpirun", "--oversubscribe", "-np", strconv.Itoa(n), "--bind-to", "none",
		"--mca", "btl", "self,vader", bin, ops, sizes)
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_plm_rsh_agent=")
	return runProcs([]*exec.Cmd{cmd}, 20*time.Minute)
}

func busFactor(op string, n int) float64 {
	if op == "all_reduce" {
		return 2 * float64(n-1) / float64(n)
	}
	return float64(n-1) / float64(n)
}

func human(b int) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

func fmtTime(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.0f us", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

func printTable(w io.Writer, all []result, impls []string) {
	type key struct {
		op    string
		ranks int
		bytes int
	}
	cells := map[key]map[string]result{}
	var keys []key
	for _, r := range all {
		impl := strings.TrimPrefix(r.Impl, "meshrun-")
		k := key{r.Op, r.Ranks, r.Bytes}
		if cells[k] == nil {
			cells[k] = map[string]result{}
			keys = append(keys, k)
		}
		cells[k][impl] = r
	}
	opOrder := map[string]int{"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.op != b.op {
			return opOrder[a.op] < opOrder[b.op]
		}
		if a.ranks != b.ranks {
			return a.ranks < b.ranks
		}
		return a.bytes < b.bytes
	})
	names := map[string]string{"shm": "meshrun shm", "tcp": "meshrun tcp", "nats": "meshrun nats", "gloo": "Gloo", "mpi": "Open MPI", "rawtcp": "raw TCP"}
	fmt.Fprintf(w, "| op | ranks | size | algo |")
	for _, im := range impls {
		fmt.Fprintf(w, " %s time, busbw |", names[im])
	}
	fmt.Fprintf(w, " shm / Gloo | shm / MPI | tcp / raw TCP |\n|---|---|---|---|")
	for range impls {
		fmt.Fprintf(w, "---|")
	}
	fmt.Fprintf(w, "---|---|---|\n")
	bus := func(r result) float64 {
		return float64(r.Bytes) / r.Sec * busFactor(r.Op, r.Ranks) / 1e9
	}
	for _, k := range keys {
		c := cells[k]
		algo := "—"
		if r, ok := c["shm"]; ok {
			algo = r.Algo
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s |", k.op, k.ranks, human(k.bytes), algo)
		for _, im := range impls {
			if r, ok := c[im]; ok {
				fmt.Fprintf(w, " %s, %.2f GB/s |", fmtTime(r.Sec), bus(r))
			} else {
				fmt.Fprintf(w, " n/a |")
			}
		}
		ratio := func(impl, peer string) string {
			a, ok1 := c[impl]
			b, ok2 := c[peer]
			if !ok1 || !ok2 {
				return "—"
			}
			return fmt.Sprintf("%.2fx", b.Sec/a.Sec)
		}
		fmt.Fprintf(w, " %s | %s | %s |\n", ratio("shm", "gloo"), ratio("shm", "mpi"), ratio("tcp", "rawtcp"))
	}
}
