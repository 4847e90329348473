package collective

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"go.uber.org/zap"

	"github.com/meshrun/meshrun/tensor"
)

// Communicator runs collectives among a fixed group of ranks on tensors of one
// device. It is the layer above the host Group: each backend moves a kind of
// buffer, and every one of them keeps the Group's coordination (sequence
// numbers, the descriptor check, deadlines, failure notices naming the culprit),
// so a dead, stuck or mismatched rank fails the job the same way on any device.
//
// Buffers are flat: counts and offsets are in elements, shapes are not read.
// Every member must make the same calls in the same order.
type Communicator interface {
	// Backend names the backend: "host", "staged" or "nccl".
	Backend() string
	// Device is the device whose tensors the communicator takes.
	Device() tensor.Device
	// Ranks returns the group's world ranks, in group order; Index is this
	// rank's position in it.
	Ranks() []int
	Index() int
	// Algorithm names the algorithm of the last collective.
	Algorithm() string

	AllReduce(ctx context.Context, buf *tensor.Tensor, op ReduceOp) error
	AllGather(ctx context.Context, in, out *tensor.Tensor, counts []int) error
	ReduceScatter(ctx context.Context, in, out *tensor.Tensor, counts []int, op ReduceOp) error
	AllToAll(ctx context.Context, send *tensor.Tensor, sendCounts []int, recv *tensor.Tensor, recvCounts []int) error
	Broadcast(ctx context.Context, buf *tensor.Tensor, root int) error
	Barrier(ctx context.Context) error
	// Send and Recv move a tensor from one member to another (p2p.go).
	PointToPoint
}

// The backends' names, and the values of Options.Collectives (and of
// MESHRUN_COLLECTIVES).
const (
	// BackendAuto picks per buffer device: host for host tensors; for device
	// tensors nccl where it is available for the device on every member and
	// no two members share a physical device, else staged.
	BackendAuto = "auto"
	// BackendHost runs the algorithms over the Transport on host memory.
	BackendHost = "host"
	// BackendStaged copies device buffers to host memory in chunks, pipelined
	// with the host algorithms, and back: it works for every device, and for
	// several ranks sharing one GPU.
	BackendStaged = "staged"
	// BackendNCCL runs NCCL on CUDA buffers, coordinated over NATS.
	BackendNCCL = "nccl"
)

// DeviceBackend is a collective library that moves one kind of device buffer
// itself (NCCL). A World uses those its Options.Backends lists: nothing
// registers one behind the caller's back.
type DeviceBackend interface {
	// Name is the backend's name ("nccl").
	Name() string
	// Serves reports whether the backend takes tensors of dev.
	Serves(dev tensor.Device) bool
	// New returns the communicator of group g for tensors of mem (its
	// device's); g carries the coordination (a unique id can travel over it)
	// and fails with it.
	New(ctx context.Context, g *Group, mem tensor.Memory) (Communicator, error)
}

// probed is a DeviceBackend that can tell, before New, whether it will work
// here (its library loads).
type probed interface{ Probe(w *World) error }

// deviceBackend returns the first of the World's backends named name (""
// for any) that serves dev.
func (w *World) deviceBackend(name string, dev tensor.Device) DeviceBackend {
	for _, b := range w.opts.Backends {
		if (name == "" || b.Name() == name) && b.Serves(dev) {
			return b
		}
	}
	return nil
}

// ParseBackend checks a backend choice: auto, host, staged or nccl.
func ParseBackend(s string) (string, error) {
	switch s {
	case "", BackendAuto:
		return BackendAuto, nil
	case BackendHost, BackendStaged, BackendNCCL:
		return s, nil
	}
	return "", fmt.Errorf("%w: collectives backend %q: want auto, host, staged or nccl", ErrInvalid, s)
}

// EnvBackend is the environment variable that chooses the backend.
const EnvBackend = "MESHRUN_COLLECTIVES"

// EnvNCCLLibrary names the NCCL library the nccl backend loads (a path;
// default libnccl.so.2). "fake" gives sim devices the nccl backend over
// the fake library of package ncclfake (a worker's choice: package job).
const EnvNCCLLibrary = "MESHRUN_NCCL_LIBRARY"

// commKey names a communicator: its group and device.
type commKey struct {
	group string
	dev   tensor.Device
}

// Communicator returns the communicator of group ranks (world ranks, in group
// order) for tensors of mem's device, creating it on first use (the Group's
// handshake, then the backend's). The backend follows Options.Collectives; the
// choice and why are logged once per communicator. It is cached per group and
// device: later calls with another memory of the device get the same one.
func (w *World) Communicator(ctx context.Context, ranks []int, mem tensor.Memory) (Communicator, error) {
	if w.parent != nil {
		return w.parent.Communicator(ctx, w.global(ranks), mem)
	}
	return w.cachedComm(ctx, commKey{fmt.Sprint(ranks), mem.Device()}, "", func() (*Group, tensor.Memory, error) {
		g, err := w.Group(ctx, ranks)
		return g, mem, err
	})
}

// cachedComm returns the communicator of key k, creating it on first use
// over the group, for tensors of the memory, that group makes (link: what
// World.Link says of it, for the log).
func (w *World) cachedComm(ctx context.Context, k commKey, link string, group func() (*Group, tensor.Memory, error)) (Communicator, error) {
	w.mu.Lock()
	if c, ok := w.dcomms[k]; ok {
		w.mu.Unlock()
		return c, nil
	}
	w.mu.Unlock()
	g, mem, err := group()
	if err != nil {
		return nil, err
	}
	c, why, err := w.newCommunicator(ctx, g, mem)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.dcomms[k]; ok {
		return old, nil
	}
	if w.dcomms == nil {
		w.dcomms = map[commKey]Communicator{}
	}
	w.dcomms[k] = c
	fields := []zap.Field{zap.Ints("ranks", g.Ranks()), zap.String("device", k.dev.String()),
		zap.String("backend", c.Backend()), zap.String("why", why)}
	if link != "" {
		fields = append(fields, zap.String("link", link))
	}
	w.log.Info("collective backend", fields...)
	return c, nil
}

// newCommunicator picks and builds the backend for g's tensors of mem.
func (w *World) newCommunicator(ctx context.Context, g *Group, mem tensor.Memory) (Communicator, string, error) {
	choice, dev := w.opts.Collectives, mem.Device()
	if dev.Kind == tensor.CPU {
		if choice == BackendStaged || choice == BackendNCCL {
			return &hostComm{g: g}, fmt.Sprintf("host buffers (%s=%s applies to device buffers)", EnvBackend, choice), nil
		}
		return &hostComm{g: g}, "host buffers", nil
	}
	switch choice {
	case BackendHost:
		return nil, "", fmt.Errorf("%w: the host backend (%s=host) takes host buffers; these are on %v: use auto or staged", ErrInvalid, EnvBackend, dev)
	case BackendStaged:
		return newStaged(g, dev, w.opts.StageBytes), "chosen (" + EnvBackend + "=staged)", nil
	case BackendNCCL:
		b := w.deviceBackend(BackendNCCL, dev)
		if b == nil {
			return nil, "", fmt.Errorf("%w: no nccl backend for %v in this build (build with -tags cuda, and NCCL present at run time)", ErrInvalid, dev)
		}
		// NCCL refuses two ranks of a communicator on one device: refused
		// here, on every member, before any data moves.
		_, shared, err := agree(ctx, g, true, mem)
		if err != nil {
			return nil, "", err
		}
		if shared != "" {
			return nil, "", &Error{Kind: ErrSharedDevice, Rank: -1, Reporter: w.rank, Group: g.key,
				Detail: fmt.Sprintf("%s, and NCCL (%s=nccl) refuses two ranks of a communicator on one device: auto or staged runs them staged", shared, EnvBackend)}
		}
		c, err := b.New(ctx, g, mem)
		return c, "chosen (" + EnvBackend + "=nccl)", err
	}
	if b := w.deviceBackend("", dev); b != nil {
		// The members agree first: a library that loads on some of them
		// and not on others would split the group between two backends, and
		// members sharing a device cannot use it.
		var why error
		if p, ok := b.(probed); ok {
			why = p.Probe(w)
		}
		all, shared, err := agree(ctx, g, why == nil, mem)
		if err != nil {
			return nil, "", err
		}
		switch {
		case why != nil:
			return newStaged(g, dev, w.opts.StageBytes), "auto: " + why.Error() + "; staged instead", nil
		case !all:
			return newStaged(g, dev, w.opts.StageBytes), "auto: " + b.Name() + " is unavailable on another member of the group; staged instead", nil
		case shared != "":
			return newStaged(g, dev, w.opts.StageBytes), "auto: " + shared + " (" + b.Name() + " refuses two ranks of a communicator on one device); staged instead", nil
		}
		c, err := b.New(ctx, g, mem)
		return c, "auto: " + b.Name() + " serves " + dev.String(), err
	}
	return newStaged(g, dev, w.opts.StageBytes), "auto: no device collective library for " + dev.String(), nil
}

// DeviceIdentity names the physical device behind mem: its DeviceID where
// the memory has one (a GPU's UUID, "GPU-…"; a sim device's), else its
// device on this host and process, so that separate processes never look
// shared.
func DeviceIdentity(mem tensor.Memory) string {
	if d, ok := mem.(interface{ DeviceID() string }); ok {
		if id := d.DeviceID(); id != "" {
			return id
		}
	}
	return fmt.Sprintf("%v@%s/%d", mem.Device(), hostname, os.Getpid())
}

var hostname = func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}()

// agree tells every member of g whether the device library is available on
// all of them (ok: on this one) and which members share a physical device
// ("ranks 0 and 1 share device GPU-…", "" when none do): each member's
// answer and device identity go to all (an all-gather of bytes).
func agree(ctx context.Context, g *Group, ok bool, mem tensor.Memory) (all bool, shared string, err error) {
	mine := []byte{0}
	if ok {
		mine[0] = 1
	}
	got, err := allGatherBytes(ctx, g, append(mine, DeviceIdentity(mem)...))
	if err != nil {
		return false, "", err
	}
	all = true
	ids := make([]string, len(got))
	for i, b := range got {
		if len(b) == 0 {
			return false, "", fmt.Errorf("%w: rank %d sent no device identity", ErrCorrupt, g.ranks[i])
		}
		all = all && b[0] == 1
		ids[i] = string(b[1:])
	}
	return all, sharedDevice(g.ranks, ids), nil
}

// sharedDevice says which ranks share the first device that several of
// them are on ("ranks 0, 2 and 3 share device D"), or "".
func sharedDevice(ranks []int, ids []string) string {
	for i, id := range ids {
		var on []string
		for j := i; j < len(ids); j++ {
			if ids[j] == id {
				on = append(on, strconv.Itoa(ranks[j]))
			}
		}
		if len(on) > 1 {
			return fmt.Sprintf("ranks %s and %s share device %s", strings.Join(on[:len(on)-1], ", "), on[len(on)-1], id)
		}
	}
	return ""
}

// hostComm is the host backend: the Group's algorithms on host tensors.
type hostComm struct{ g *Group }

func (c *hostComm) Backend() string       { return BackendHost }
func (c *hostComm) Device() tensor.Device { return tensor.Device{Kind: tensor.CPU} }
func (c *hostComm) Ranks() []int          { return c.g.Ranks() }
func (c *hostComm) Index() int            { return c.g.Index() }
func (c *hostComm) Algorithm() string     { return c.g.Algorithm() }

func (c *hostComm) Barrier(ctx context.Context) error { return c.g.Barrier(ctx) }

// onHost checks that every tensor is a host tensor of one float dtype.
func onHost(ts ...*tensor.Tensor) (tensor.DType, error) {
	return sameDevice(tensor.Device{Kind: tensor.CPU}, ts...)
}

func (c *hostComm) AllReduce(ctx context.Context, buf *tensor.Tensor, op ReduceOp) error {
	dt, err := onHost(buf)
	if err != nil {
		return err
	}
	return hostAllReduce(ctx, c.g, dt, tensor.HostBytes(buf), op)
}

func (c *hostComm) AllGather(ctx context.Context, in, out *tensor.Tensor, counts []int) error {
	dt, err := onHost(in, out)
	if err != nil {
		return err
	}
	return hostAllGather(ctx, c.g, dt, tensor.HostBytes(in), tensor.HostBytes(out), counts)
}

func (c *hostComm) ReduceScatter(ctx context.Context, in, out *tensor.Tensor, counts []int, op ReduceOp) error {
	dt, err := onHost(in, out)
	if err != nil {
		return err
	}
	return hostReduceScatter(ctx, c.g, dt, tensor.HostBytes(in), tensor.HostBytes(out), counts, op)
}

func (c *hostComm) AllToAll(ctx context.Context, send *tensor.Tensor, sendCounts []int, recv *tensor.Tensor, recvCounts []int) error {
	dt, err := onHost(send, recv)
	if err != nil {
		return err
	}
	return hostAllToAll(ctx, c.g, dt, tensor.HostBytes(send), sendCounts, tensor.HostBytes(recv), recvCounts)
}

func (c *hostComm) Broadcast(ctx context.Context, buf *tensor.Tensor, root int) error {
	dt, err := onHost(buf)
	if err != nil {
		return err
	}
	return hostBroadcast(ctx, c.g, dt, tensor.HostBytes(buf), root)
}

// sameDevice checks that every tensor lives on dev, in one float dtype.
func sameDevice(dev tensor.Device, ts ...*tensor.Tensor) (tensor.DType, error) {
	var dt tensor.DType
	for _, t := range ts {
		if t.Device() != dev {
			return 0, fmt.Errorf("%w: %v given to a communicator of %v", ErrInvalid, t, dev)
		}
		if !t.DType().Valid() {
			return 0, fmt.Errorf("%w: collectives move float32, float64 and bfloat16, not %v", ErrInvalid, t.DType())
		}
		if dt != 0 && t.DType() != dt {
			return 0, fmt.Errorf("%w: mixed %v and %v", ErrInvalid, dt, t.DType())
		}
		dt = t.DType()
	}
	return dt, nil
}

// AllGatherBytes gathers every rank's bytes (of any length) on every rank, in
// rank order, over the world group: for small control data (errors, records)
// that must reach every rank. The bytes travel as opaque 2-byte elements.
func AllGatherBytes(ctx context.Context, w *World, b []byte) ([][]byte, error) {
	g, err := w.WorldGroup(ctx)
	if err != nil {
		return nil, err
	}
	return allGatherBytes(ctx, g, b)
}

// allGatherBytes is AllGatherBytes over group g, in group order.
func allGatherBytes(ctx context.Context, g *Group, b []byte) ([][]byte, error) {
	n := g.Size()
	lens := make([]float64, n)
	ones := make([]int, n)
	for i := range ones {
		ones[i] = 1
	}
	if err := AllGather(ctx, g, []float64{float64(len(b))}, lens, ones); err != nil {
		return nil, err
	}
	counts := make([]int, n)
	total := 0
	for r, l := range lens {
		counts[r] = (int(l) + 1) / 2
		total += counts[r]
	}
	in := make([]tensor.BF16, counts[g.me])
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(in))), 2*len(in)), b)
	out := make([]tensor.BF16, total)
	if err := AllGather(ctx, g, in, out, counts); err != nil {
		return nil, err
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), 2*len(out))
	res := make([][]byte, n)
	off := 0
	for r := range res {
		res[r] = append([]byte(nil), raw[2*off:2*off+int(lens[r])]...)
		off += counts[r]
	}
	return res, nil
}
