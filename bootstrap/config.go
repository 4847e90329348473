package bootstrap

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/transport"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Config is how a worker joins its job. EnvConfig reads it from the environment
// the launcher sets:
//
//	RANK, WORLD_SIZE                 this rank and the number of ranks (required)
//	LOCAL_RANK, LOCAL_WORLD_SIZE     rank and ranks on this node
//	NODE_RANK, NNODES                this node and the number of nodes
//	MESHRUN_JOB_ID                   job id (required): subjects are meshrun.<job>.…
//	MESHRUN_NATS_URL                 NATS server (required)
//	MESHRUN_NATS_CREDS               path of a 0600 credentials file (format: see
//	                                 package bootstrap/natsconn/creds: user=… and password=… lines)
//	MESHRUN_TRANSPORT                auto (default) | shm | tcp | nats | none
//	                                 (none: control plane only, for simulation)
//	MESHRUN_TCP_HOST                 address the tcp data listener binds and
//	                                 announces (default 127.0.0.1 on one node;
//	                                 on several, the host name's address, else
//	                                 the one that reaches the NATS server)
//	MESHRUN_COLLECTIVE_TIMEOUT       deadline of one collective (Go duration)
//	MESHRUN_RENDEZVOUS_TIMEOUT       deadline of the rendezvous (Go duration)
//	MESHRUN_CHUNK_BYTES              pipelining chunk of large collectives
//	MESHRUN_SMALL_BYTES              largest collective using direct algorithms
//	MESHRUN_SHM_SPIN                 shm: yields before a futex sleep (0: none)
//	MESHRUN_SHM_SINGLE_COPY          shm: 1 turns on cross-memory attach
//	MESHRUN_SHM_ARENA                shm: bytes of each rank's arena (0: none)
type Config struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	NodeRank, NNodes          int
	Job                       string
	NATSURL                   string
	CredsFile                 string
	// Creds, when set, is used instead of CredsFile (tests, in-process callers).
	Creds *creds.Credentials
	// NATSCA, NATSCert and NATSKey are TLS files (MESHRUN_NATS_CA, _CERT, _KEY);
	// NATSInsecure allows plaintext to a non-loopback server
	// (MESHRUN_NATS_INSECURE). The policy is natsconn's.
	NATSCA, NATSCert, NATSKey string
	NATSInsecure              bool
	// Dialer, when set, opens the rank's NATS connection (nats.SetCustomDialer).
	// For simulation and fault injection: bench/control closes the socket it
	// returns to kill a simulated rank's control plane abruptly.
	Dialer nats.CustomDialer
	// Transport: "auto" (shm when every rank is on one host, else tcp), "shm",
	// "tcp", "nats", or "none": no data plane at all, every collective fails
	// with ErrInvalid; the control plane (rendezvous, heartbeats, notices,
	// abort) runs for real. "none" is for simulating many ranks in one process
	// (bench/control).
	Transport string
	TCPHost   string
	// Shm configures the shm transport (its Logger is the rank's).
	Shm transport.ShmOptions
	// RendezvousTimeout bounds the wait for the whole roster; default 30 s.
	RendezvousTimeout time.Duration
	// HeartbeatInterval (default 500 ms) and HeartbeatTimeout (default 5 s): a
	// rank silent for HeartbeatTimeout is lost.
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// Options of the World (timeouts, chunking, logger).
	collective.Options

	envErrs []string
}

// EnvConfig reads the Config from the environment; problems are reported by
// Validate (and Join), all at once.
func EnvConfig() Config {
	var c Config
	num := func(name string, required bool, dst *int) {
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			if required {
				c.envErrs = append(c.envErrs, name+" is not set")
			}
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			c.envErrs = append(c.envErrs, fmt.Sprintf("%s=%q is not a non-negative integer", name, v))
			return
		}
		*dst = n
	}
	dur := func(name string, dst *time.Duration) {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				c.envErrs = append(c.envErrs, fmt.Sprintf("%s=%q is not a positive duration", name, v))
				return
			}
			*dst = d
		}
	}
	num("RANK", true, &c.Rank)
	num("WORLD_SIZE", true, &c.WorldSize)
	num("LOCAL_RANK", false, &c.LocalRank)
	num("LOCAL_WORLD_SIZE", false, &c.LocalWorldSize)
	num("NODE_RANK", false, &c.NodeRank)
	num("NNODES", false, &c.NNodes)
	c.Job = os.Getenv("MESHRUN_JOB_ID")
	nc := natsconn.FromEnv(os.Getenv)
	c.NATSURL, c.CredsFile, c.NATSCA, c.NATSCert, c.NATSKey, c.NATSInsecure = nc.URL, nc.CredsFile, nc.CA, nc.Cert, nc.Key, nc.Insecure
	c.Transport = os.Getenv("MESHRUN_TRANSPORT")
	c.TCPHost = os.Getenv("MESHRUN_TCP_HOST")
	dur("MESHRUN_COLLECTIVE_TIMEOUT", &c.DataTimeout)
	dur("MESHRUN_RENDEZVOUS_TIMEOUT", &c.RendezvousTimeout)
	num("MESHRUN_CHUNK_BYTES", false, &c.ChunkBytes)
	num("MESHRUN_SMALL_BYTES", false, &c.SmallBytes)
	num("MESHRUN_STAGE_BYTES", false, &c.StageBytes)
	c.Shm = envShm()
	c.Collectives = os.Getenv(collective.EnvBackend)
	return c
}

// Validate reports every problem of the config at once.
func (c *Config) Validate() error {
	errs := append([]string(nil), c.envErrs...)
	if c.WorldSize < 1 {
		errs = append(errs, "world size must be at least 1")
	} else if c.Rank < 0 || c.Rank >= c.WorldSize {
		errs = append(errs, fmt.Sprintf("rank %d outside world of %d", c.Rank, c.WorldSize))
	}
	if c.Job == "" {
		errs = append(errs, "no job id (MESHRUN_JOB_ID)")
	} else if strings.ContainsAny(c.Job, ".*> \t\n") {
		errs = append(errs, fmt.Sprintf("job id %q must not contain '.', '*', '>' or spaces", c.Job))
	}
	if c.NATSURL == "" {
		errs = append(errs, "no NATS url (MESHRUN_NATS_URL)")
	}
	if c.Creds == nil && c.CredsFile == "" {
		errs = append(errs, "no NATS credentials (MESHRUN_NATS_CREDS)")
	}
	if c.NATSURL != "" && (c.Creds != nil || c.CredsFile != "") {
		if err := c.natsConfig().Validate(); err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), natsconn.ErrConfig.Error()+": "))
		}
	}
	switch c.Transport {
	case "", "auto", "shm", "tcp", "nats", "none":
	default:
		errs = append(errs, fmt.Sprintf("transport %q: want auto, shm, tcp, nats or none", c.Transport))
	}
	if _, err := collective.ParseBackend(c.Collectives); err != nil {
		errs = append(errs, fmt.Sprintf("%s=%q: want auto, host, staged or nccl", collective.EnvBackend, c.Collectives))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", collective.ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

func (c *Config) defaults() {
	if c.Transport == "" {
		c.Transport = "auto"
	}
	if c.RendezvousTimeout <= 0 {
		c.RendezvousTimeout = 30 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 500 * time.Millisecond
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 5 * time.Second
	}
	if c.Options.Job == "" {
		c.Options.Job = c.Job
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop() // the World's other defaults are NewWorld's
	}
}

// natsConfig is the rank's NATS connection settings.
func (c *Config) natsConfig() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, CredsFile: c.CredsFile, Creds: c.Creds, CA: c.NATSCA, Cert: c.NATSCert,
		Key: c.NATSKey, Insecure: c.NATSInsecure, Name: fmt.Sprintf("meshrun-%s-rank-%d", c.Job, c.Rank)}
}

// envShm reads the shm transport's settings. A value that is not a
// non-negative integer leaves the default; 0 is none (no yields, no arena).
func envShm() transport.ShmOptions {
	var o transport.ShmOptions
	count := func(name string) int {
		v, err := strconv.Atoi(os.Getenv(name))
		switch {
		case err != nil || v < 0:
			return 0
		case v == 0:
			return -1
		}
		return v
	}
	o.Spin = count("MESHRUN_SHM_SPIN")
	o.SingleCopy = os.Getenv("MESHRUN_SHM_SINGLE_COPY") == "1"
	o.ArenaBytes = count("MESHRUN_SHM_ARENA")
	return o
}
