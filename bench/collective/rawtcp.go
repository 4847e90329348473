package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The raw TCP peer: what loopback TCP itself carries for a collective's
// traffic. n processes of this program connect in a ring (each rank dials
// the next) over plain TCP sockets with the kernel's defaults, and for every
// op and size move exactly the bytes meshrun's ring algorithm moves, with no
// header, no reduction and no copy: n-1 steps (2(n-1) for all-reduce) in
// which each rank writes one segment of S/n bytes to the next rank while it
// reads one from the previous. Its bus bandwidth is the ceiling the tcp
// transport is measured against.

// runRawTCP starts the raw TCP ranks.
func runRawTCP(tmp string, n int, ops, sizes string) ([]result, error) {
	dir, err := os.MkdirTemp(tmp, "rawtcp-")
	if err != nil {
		return nil, err
	}
	return runSelf(n, func(int) []string {
		return []string{"MESHRUN_BENCH_RAWTCP=" + dir, "BENCH_OPS=" + ops, "BENCH_SIZES=" + sizes}
	})
}

// rawRing is one rank's two sockets: to the next rank, from the previous.
type rawRing struct {
	next, prev net.Conn
}

// dialRing listens, publishes its address in dir, and dials the next rank.
func dialRing(dir string, k, n int) (*rawRing, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	tmp := filepath.Join(dir, fmt.Sprintf("%d.tmp", k))
	if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, strconv.Itoa(k))); err != nil {
		return nil, err
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() { c, err := ln.Accept(); acc <- accepted{c, err} }()
	var addr []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		addr, err = os.ReadFile(filepath.Join(dir, strconv.Itoa((k+1)%n)))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	next, err := net.Dial("tcp", string(addr))
	if err != nil {
		return nil, err
	}
	a := <-acc
	if a.err != nil {
		return nil, a.err
	}
	return &rawRing{next: next, prev: a.c}, nil
}

// step writes out to the next rank while it reads in from the previous.
func (r *rawRing) step(out, in []byte) error {
	done := make(chan error, 1)
	go func() { _, err := r.next.Write(out); done <- err }()
	if _, err := io.ReadFull(r.prev, in); err != nil {
		return err
	}
	return <-done
}

// barrier passes a token around the ring twice: once everyone has arrived,
// once to release them.
func (r *rawRing) barrier(k int) error {
	var b [1]byte
	for round := 0; round < 2; round++ {
		if k == 0 {
			if _, err := r.next.Write(b[:]); err != nil {
				return err
			}
			if _, err := io.ReadFull(r.prev, b[:]); err != nil {
				return err
			}
			continue
		}
		if _, err := io.ReadFull(r.prev, b[:]); err != nil {
			return err
		}
		if _, err := r.next.Write(b[:]); err != nil {
			return err
		}
	}
	return nil
}

func rawWorker(dir string) error {
	k, _ := strconv.Atoi(os.Getenv("RANK"))
	n, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	ring, err := dialRing(dir, k, n)
	if err != nil {
		return err
	}
	defer ring.next.Close()
	defer ring.prev.Close()
	for _, op := range strings.Split(os.Getenv("BENCH_OPS"), ",") {
		steps := n - 1
		if op == "all_reduce" {
			steps = 2 * (n - 1)
		}
		for _, s := range strings.Split(os.Getenv("BENCH_SIZES"), ",") {
			size, _ := strconv.Atoi(s)
			seg := size / n
			out, in := make([]byte, seg), make([]byte, seg)
			call := func() error {
				for i := 0; i < steps; i++ {
					if err := ring.step(out, in); err != nil {
						return err
					}
				}
				return nil
			}
			if err := call(); err != nil {
				return err
			}
			best, err := timeCalls(size, func() error { return ring.barrier(k) }, call)
			if err != nil {
				return err
			}
			if k == 0 {
				b, _ := json.Marshal(result{Impl: "rawtcp", Op: op, Ranks: n, Bytes: size, Sec: best, Algo: "ring"})
				fmt.Printf("%s\n", b)
			}
		}
	}
	return ring.barrier(k)
}
