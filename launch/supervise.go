package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/launch/cpulimit"
	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/runlog"
)

// ErrHang reports a job that ended because a rank never entered a collective
// its peers waited in; the error names the rank.
var ErrHang = errors.New("launch: hang")

// hangStacksSettle is how long the launcher lets the ranks write their stacks
// (asked on a hang) before it tears the job down.
const hangStacksSettle = 500 * time.Millisecond

// restartWait bounds how long a launcher waits for the other nodes' launchers
// to finish an attempt before the next (several nodes).
const restartWait = 60 * time.Second

// run runs the job: its folder and coordination plane, then one attempt, or
// up to 1 + --max-restarts of them, and the summary.
func (j *job) run(ctx context.Context) (int, error) {
	began := time.Now()
	if err := ctx.Err(); err != nil {
		return ExitInterrupted, fmt.Errorf("interrupted before start: %w", err)
	}
	ev, code, err := j.openJobDir()
	if err != nil {
		return code, err
	}
	defer os.Remove(filepath.Join(j.dir, reserveFile))
	defer ev.close()
	ev.emit("job_start", "job_id", j.id, "node", j.NodeRank, "nnodes", j.nnodes, "world_size", j.world,
		"local_ranks", len(j.ranks), "command", redactArgs(append([]string{j.path}, j.args...)), "max_restarts", j.MaxRestarts,
		"launcher_pid", os.Getpid())
	if stale := cleanStaleCreds(j.LogDir); len(stale) > 0 {
		ev.emit("stale_creds_removed", "files", stale)
	}

	show, _ := j.consoleFilter()
	outCon := logview.NewConsole(j.Stdout, collapseWindow, func(r int) bool { return show(r) && j.shown(r, 1) })
	errCon := logview.NewConsole(j.Stderr, collapseWindow, func(r int) bool { return show(r) && j.shown(r, 2) })
	defer outCon.Close()
	defer errCon.Close()
	say := func(format string, a ...any) { errCon.Notice(time.Now(), "launcher: "+fmt.Sprintf(format, a...)) }

	if j.CPUsPerRank > 0 {
		if j.cpu, err = cpulimit.New(j.id, j.CPUsPerRank); err != nil {
			ev.emit("job_end", "exit_code", 1, "error", err.Error())
			return 1, cannotStart{err}
		}
		defer j.cpu.Close()
	}
	conf, pl, stop, err := j.startPlane(say)
	if err != nil {
		ev.emit("job_end", "exit_code", 1, "error", err.Error())
		return 1, cannotStart{err}
	}
	defer stop()
	if j.NATS != "" {
		if err := pl.announce(j.hello(), presenceWindow, say); err != nil {
			// Not told to the others: the job that runs is theirs.
			ev.emit("job_end", "exit_code", ExitUsage, "error", err.Error())
			return ExitUsage, err
		}
	}
	ev.emit("nats_ready", "url", conf.URL, "embedded", j.NATS == "")

	say("job %s, node %d of %d, %d of %d ranks, logs in %s", j.id, j.NodeRank, j.nnodes, len(j.ranks), j.world, j.dir)

	common := j.commonEnv(conf)
	var timeoutC <-chan time.Time
	if j.Timeout > 0 {
		t := time.NewTimer(j.Timeout - time.Since(began))
		defer t.Stop()
		timeoutC = t.C
	}
	newAttempt := func(n int) *attempt {
		return &attempt{j: j, n: n, ev: ev, pl: pl, url: conf.URL, say: say, outCon: outCon, errCon: errCon, began: time.Now(),
			reported: map[string]bool{}, remoteFails: map[int]RootCause{}, stoppedStates: map[int]string{}}
	}
	sums, last := j.attempts(ctx, newAttempt, common, timeoutC)
	if j.nnodes > 1 && j.NodeRank == 0 && (j.MasterAddr == "" || j.MasterPort == 0) && last.env != nil && last.outcome == OutcomeOK {
		if missing := pl.mastersHandedOut(last.n, j.nnodes, restartWait); len(missing) > 0 {
			say("nodes %s never asked for MASTER_ADDR/MASTER_PORT of attempt %d", FormatRanks(missing), last.n)
		}
	}
	s := sums[len(sums)-1]
	sum := Summary{JobID: j.id, Node: j.NodeRank, NNodes: j.nnodes, WorldSize: j.world, AttemptSummary: s,
		DurationMS: time.Since(began).Milliseconds(), Attempts: sums}
	if err := writeJSON(filepath.Join(j.dir, SummaryFile), sum); err != nil {
		say("%v", err)
	}
	ev.emit("job_end", "exit_code", s.ExitCode, "reason", s.Reason, "attempts", len(sums))
	return s.ExitCode, last.err()
}

// openJobDir makes the job's folder and its events file, and the reserve of
// space for the launcher's last words; on an error it returns the exit code.
func (j *job) openJobDir() (*events, int, error) {
	if err := j.makeJobDir(); err != nil {
		return nil, 1, cannotStart{fmt.Errorf("job folder: %w", err)}
	}
	ev, err := openEvents(j.dir)
	if errors.Is(err, os.ErrExist) {
		// The folder is another launcher's (the events file is created
		// exclusively): this job id ran here before, or another node of the
		// job shares this --log-dir.
		if _, other := jobStart(filepath.Join(j.dir, EventsFile)); j.nnodes > 1 && other >= 0 && other != j.NodeRank {
			return nil, ExitUsage, fmt.Errorf("%w: job folder %s holds node %d's logs of job %s: with several nodes on one file system give each node its own --log-dir (e.g. runs/node-%d)",
				ErrInvalid, j.dir, other, j.id, j.NodeRank)
		}
		return nil, ExitUsage, fmt.Errorf("%w: job folder %s already holds a job; pick another --job-id", ErrInvalid, j.dir)
	}
	if err != nil {
		return nil, 1, cannotStart{fmt.Errorf("job folder: %w", err)}
	}
	reserveSpace(j.dir)
	return ev, 0, nil
}

// startPlane starts the coordination plane: an embedded server on one
// machine, else the external one every launcher of the job reaches; and the
// guard of the ranks' children. It returns the NATS configuration the ranks
// use, the launcher's connection, and stop, which undoes it all (in the
// reverse order); on an error it has undone what it did.
func (j *job) startPlane(say func(format string, a ...any)) (conf natsconn.Config, pl *plane, stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	var own natsconn.Config // what the launcher uses
	if j.NATS == "" {
		srv, err := natsrv.Start(natsrv.Options{Jobs: []string{j.id}})
		if err != nil {
			return conf, nil, stop, err
		}
		undo = append(undo, srv.Shutdown)
		credsPath, err := filepath.Abs(filepath.Join(j.dir, CredsFile))
		// The credentials are useless once the server is gone; do not leave them.
		undo = append(undo, func() { os.Remove(credsPath) })
		if err == nil {
			err = srv.WriteCredentials(j.id, credsPath)
		}
		if err != nil {
			return conf, nil, stop, fmt.Errorf("nats credentials: %w", err)
		}
		if j.guard, err = startGuard(j.tag, credsPath); err != nil {
			say("%v: ranks' children may outlive a launcher killed by a signal", err)
		}
		admin := srv.Admin()
		conf = natsconn.Config{URL: srv.URL(), CredsFile: credsPath}
		own = natsconn.Config{URL: srv.URL(), Creds: &admin}
	} else {
		conf = j.natsConfig()
		for _, f := range []*string{&conf.CredsFile, &conf.CA, &conf.Cert, &conf.Key} {
			if *f != "" {
				if *f, err = filepath.Abs(*f); err != nil {
					return conf, nil, stop, err
				}
			}
		}
		own = conf
		if j.guard, err = startGuard(j.tag, ""); err != nil {
			say("%v: ranks' children may outlive a launcher killed by a signal", err)
		}
	}
	undo = append(undo, j.guard.done)
	undo = append(undo, noteSecrets(j.NATS == "", conf, own))
	own.Name = fmt.Sprintf("meshrun-launcher-%d", j.NodeRank)
	// Node 0 reads every rank's heartbeats (it looks for hangs and tells the
	// others); the other nodes read their own ranks'.
	var local []int
	if j.NodeRank != 0 {
		for _, r := range j.ranks {
			local = append(local, r.Rank)
		}
	}
	pl, err = connectPlane(own, j.id, j.NodeRank, local, say)
	if err != nil {
		return conf, nil, stop, err
	}
	undo = append(undo, pl.close)
	return conf, pl, stop, nil
}

// attempts runs attempt 0 and, while --max-restarts allows and the attempt
// ended so that every node may run again, the next; it returns every
// attempt's summary and the last attempt.
func (j *job) attempts(ctx context.Context, newAttempt func(n int) *attempt, common map[string]string, timeoutC <-chan time.Time) ([]AttemptSummary, *attempt) {
	var sums []AttemptSummary
	for n := 0; ; n++ {
		a := newAttempt(n)
		if err := a.prepare(common); err != nil {
			a.onFatal(err) // the other nodes' ranks would wait for this one's
		} else {
			a.run(ctx, timeoutC)
		}
		s := a.summary()
		if n > 0 {
			if err := writeJSON(filepath.Join(a.dir, SummaryFile), s); err != nil {
				a.say("%v", err)
			}
		}
		sums = append(sums, s)
		if n >= j.MaxRestarts {
			return sums, a
		}
		restart, why := a.restart(s)
		if !restart {
			return sums, a
		}
		a.say("%s: restarting every rank (restart %d of %d)", why, n+1, j.MaxRestarts)
		a.ev.emit("restart", "attempt", n+1, "after", a.outcome, "exit_code", s.ExitCode)
		a.pl.reset()
	}
}

// restart reports whether the job runs again after attempt a, which ended
// as s says, and why: a rank's failure or a hang here; with several nodes,
// on any node, none having ended otherwise (every node restarts, or none).
func (a *attempt) restart(s AttemptSummary) (bool, string) {
	j, n := a.j, a.n
	restart, why := restartable(a.outcome), fmt.Sprintf("attempt %d ended (%s, exit %d)", n, a.outcome, s.ExitCode)
	if j.nnodes > 1 {
		// Every node restarts, or none: each says how its ranks ended.
		outs, err := a.pl.attemptDone(n, a.outcome, j.nnodes, restartWait)
		if err != nil {
			a.say("%v", err)
			return false, ""
		}
		restart = false
		for node := 0; node < j.nnodes; node++ {
			o := outs[node]
			if !restartable(o) && o != OutcomeOK {
				restart = false
				break
			}
			if restartable(o) && !restart {
				restart = true
				why = fmt.Sprintf("attempt %d ended (%s on node %d)", n, o, node)
			}
		}
	}
	return restart, why
}

// attemptDir is the folder of attempt n's ranks: the job folder for the
// first, attempt-N in it after.
func (j *job) attemptDir(n int) string {
	if n == 0 {
		return j.dir
	}
	return filepath.Join(j.dir, AttemptDir(n))
}

// nodeOf is the node of a rank (every node runs as many ranks).
func (j *job) nodeOf(rank int) int { return rank / len(j.ranks) }

// commonEnv is the environment every rank of every attempt gets, besides
// what the launcher inherited.
// envCollectives chooses the collective backend of device buffers (package
// collective's EnvBackend).
const envCollectives = "MESHRUN_COLLECTIVES"

// sharesGPU reports whether two cuda ranks of this node were given one GPU
// (--share-gpus).
func (j *job) sharesGPU() bool {
	seen := map[string]bool{}
	for _, r := range j.ranks {
		if r.GPU != "" && seen[r.GPU] {
			return true
		}
		seen[r.GPU] = true
	}
	return false
}

func (j *job) commonEnv(conf natsconn.Config) map[string]string {
	common := map[string]string{
		"WORLD_SIZE":       strconv.Itoa(j.world),
		"LOCAL_WORLD_SIZE": strconv.Itoa(len(j.ranks)),
		"NNODES":           strconv.Itoa(j.nnodes),
		"NODE_RANK":        strconv.Itoa(j.NodeRank),
		"MESHRUN_NODE":     strconv.Itoa(j.NodeRank),
		"MESHRUN_JOB_ID":   j.id,
		EnvLauncherTag:     j.tag,
		EnvDevice:          j.device,
	}
	if j.Kernels != "" {
		common[EnvKernels] = j.Kernels
	}
	if j.DType != "" {
		common[EnvDType] = j.DType
	}
	if j.TraceMax != "" {
		common[runlog.EnvTraceMax] = j.TraceMax
	}
	for k, v := range j.torchEnv() {
		common[k] = v
	}
	if _, set := os.LookupEnv(envCollectives); !set && j.sharesGPU() {
		// NCCL refuses two ranks of a communicator on one GPU.
		common[envCollectives] = "staged"
	}
	for _, kv := range conf.Env() {
		k, v, _ := strings.Cut(kv, "=")
		common[k] = v
	}
	return common
}
