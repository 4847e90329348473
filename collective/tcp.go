package collective

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The tcp transport: one connection per pair of ranks, the higher rank dialing
// the lower. Before a byte of data is accepted, both ends prove knowledge of
// the job's secret (distributed in the rendezvous roster) with an HMAC-SHA256
// challenge over fresh nonces:
//
//	dialer   -> acceptor  "MRT1" | job hash u64 | dialer rank u32 | acceptor rank u32 | nonceD[32]
//	acceptor -> dialer    nonceA[32] | HMAC(secret, "acceptor" | hello | nonceA)
//	dialer   -> acceptor  HMAC(secret, "dialer" | hello | nonceA)
//
// A connection that fails the handshake is closed; a duplicate is refused.
// Frames are the 80-byte Header followed by its payload, written with writev.

const (
	tcpHelloSize = 4 + 8 + 4 + 4 + 32
	tcpMACSize   = sha256.Size
)

type tcpConn struct {
	c     *net.TCPConn
	peer  int
	wmu   sync.Mutex
	rmu   sync.Mutex
	wh    [HeaderSize]byte
	rh    [HeaderSize]byte
	bufs  [2][]byte
	abort atomic.Pointer[error]
}

type tcpTransport struct {
	rank, size int
	job        uint64
	conns      []*tcpConn
	ln         net.Listener
	closeOnce  sync.Once
}

// TCPListen opens the data listener a rank announces in the rendezvous.
func TCPListen(host string) (net.Listener, error) {
	if host == "" {
		host = "127.0.0.1"
	}
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}

// NewTCPTransport connects rank to every other rank: it accepts the higher ranks
// on ln and dials the lower ones at addrs[j]. secret authenticates both ends.
func NewTCPTransport(ctx context.Context, rank, size int, ln net.Listener, addrs []string, secret []byte, job string) (Transport, error) {
	if len(addrs) != size || len(secret) < 16 {
		return nil, fmt.Errorf("%w: tcp transport needs %d addresses and a secret", ErrInvalid, size)
	}
	t := &tcpTransport{rank: rank, size: size, job: hash64("job:" + job), conns: make([]*tcpConn, size), ln: ln}
	type res struct {
		c    *tcpConn
		err  error
		peer int
	}
	results := make(chan res, size)
	expect := size - 1 - rank
	// Accept higher ranks.
	var wg sync.WaitGroup
	if expect > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := 0
			for got < expect {
				if d, ok := ctx.Deadline(); ok {
					ln.(*net.TCPListener).SetDeadline(d)
				}
				c, err := ln.Accept()
				if err != nil {
					results <- res{err: fmt.Errorf("accepting data connections: %w", err), peer: -1}
					return
				}
				peer, err := t.acceptHandshake(c.(*net.TCPConn), secret)
				if err != nil {
					c.Close() // unauthenticated or malformed: drop it, keep listening
					continue
				}
				got++
				results <- res{c: &tcpConn{c: c.(*net.TCPConn), peer: peer}, peer: peer}
			}
		}()
	}
	// Dial lower ranks.
	for j := 0; j < rank; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := t.dial(ctx, addrs[j], j, secret)
			results <- res{c: c, err: err, peer: j}
		}()
	}
	var firstErr error
	for k := 0; k < size-1; k++ {
		select {
		case r := <-results:
			if r.err != nil {
				if firstErr == nil {
					firstErr = r.err
				}
				continue
			}
			if t.conns[r.peer] != nil {
				r.c.c.Close()
				continue
			}
			t.conns[r.peer] = r.c
		case <-ctx.Done():
			if firstErr == nil {
				firstErr = ctx.Err()
			}
		}
		if firstErr != nil {
			break
		}
	}
	if firstErr != nil {
		ln.Close()
		wg.Wait()
		close(results)
		for r := range results {
			if r.c != nil {
				r.c.c.Close()
			}
		}
		t.Close()
		var missing []int
		for j := range t.conns {
			if j != rank && t.conns[j] == nil {
				missing = append(missing, j)
			}
		}
		return nil, &Error{Kind: ErrPeerLost, Rank: firstOr(missing, -1), Reporter: rank, Detail: fmt.Sprintf("tcp mesh incomplete, no connection to ranks %v: %v", missing, firstErr)}
	}
	wg.Wait()
	for _, c := range t.conns {
		if c != nil {
			c.c.SetNoDelay(true)
			c.c.SetReadBuffer(4 << 20)
			c.c.SetWriteBuffer(4 << 20)
		}
	}
	return t, nil
}

func firstOr(xs []int, d int) int {
	if len(xs) > 0 {
		return xs[0]
	}
	return d
}

func mac(secret []byte, role string, hello, nonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(role))
	m.Write(hello)
	m.Write(nonce)
	return m.Sum(nil)
}

func (t *tcpTransport) dial(ctx context.Context, addr string, peer int, secret []byte) (*tcpConn, error) {
	var d net.Dialer
	var c net.Conn
	var err error
	for {
		c, err = d.DialContext(ctx, "tcp", addr)
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("dialing rank %d at %s: %w", peer, addr, err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	hello := make([]byte, tcpHelloSize)
	copy(hello, "MRT1")
	binary.LittleEndian.PutUint64(hello[4:], t.job)
	binary.LittleEndian.PutUint32(hello[12:], uint32(t.rank))
	binary.LittleEndian.PutUint32(hello[16:], uint32(peer))
	rand.Read(hello[20:])
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake with rank %d: %w", peer, err)
	}
	resp := make([]byte, 32+tcpMACSize)
	if _, err := io.ReadFull(c, resp); err != nil {
		c.Close()
		return nil, &Error{Kind: ErrAuth, Rank: peer, Reporter: t.rank, Detail: "handshake: " + err.Error()}
	}
	nonceA := resp[:32]
	if !hmac.Equal(resp[32:], mac(secret, "acceptor", hello, nonceA)) {
		c.Close()
		return nil, &Error{Kind: ErrAuth, Rank: peer, Reporter: t.rank, Detail: "acceptor failed the challenge"}
	}
	if _, err := c.Write(mac(secret, "dialer", hello, nonceA)); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake with rank %d: %w", peer, err)
	}
	// The acceptor confirms with one byte once it has checked our answer.
	var ok [1]byte
	if _, err := io.ReadFull(c, ok[:]); err != nil || ok[0] != 1 {
		c.Close()
		return nil, &Error{Kind: ErrAuth, Rank: peer, Reporter: t.rank, Detail: "refused by the acceptor"}
	}
	c.SetDeadline(time.Time{})
	return &tcpConn{c: c.(*net.TCPConn), peer: peer}, nil
}

func (t *tcpTransport) acceptHandshake(c *net.TCPConn, secret []byte) (int, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	hello := make([]byte, tcpHelloSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return -1, err
	}
	if !bytes.Equal(hello[:4], []byte("MRT1")) || binary.LittleEndian.Uint64(hello[4:]) != t.job {
		return -1, ErrAuth
	}
	peer := int(binary.LittleEndian.Uint32(hello[12:]))
	if peer <= t.rank || peer >= t.size || int(binary.LittleEndian.Uint32(hello[16:])) != t.rank {
		return -1, ErrAuth
	}
	resp := make([]byte, 32, 32+tcpMACSize)
	rand.Read(resp)
	resp = append(resp, mac(secret, "acceptor", hello, resp[:32])...)
	if _, err := c.Write(resp); err != nil {
		return -1, err
	}
	answer := make([]byte, tcpMACSize)
	if _, err := io.ReadFull(c, answer); err != nil {
		return -1, err
	}
	if !hmac.Equal(answer, mac(secret, "dialer", hello, resp[:32])) {
		return -1, ErrAuth
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return -1, err
	}
	c.SetDeadline(time.Time{})
	return peer, nil
}

func (t *tcpTransport) Name() string  { return "tcp" }
func (t *tcpTransport) Rank() int     { return t.rank }
func (t *tcpTransport) Size() int     { return t.size }
func (t *tcpTransport) MaxChunk() int { return MaxPayload }

func (t *tcpTransport) ioErr(c *tcpConn, err error, what string) error {
	if p := c.abort.Load(); p != nil {
		return *p
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Kind: ErrTimeout, Rank: c.peer, Reporter: t.rank, Detail: what}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
		return &Error{Kind: ErrPeerLost, Rank: c.peer, Reporter: t.rank, Detail: what + ": connection closed by the peer"}
	}
	return &Error{Kind: ErrPeerLost, Rank: c.peer, Reporter: t.rank, Detail: what + ": " + err.Error()}
}

func (t *tcpTransport) Send(ctx context.Context, peer int, h *Header, p []byte) error {
	c := t.conns[peer]
	if c == nil {
		return &Error{Kind: ErrInvalid, Rank: peer, Reporter: t.rank, Detail: "no connection"}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if e := c.abort.Load(); e != nil {
		return *e
	}
	if d, ok := ctx.Deadline(); ok {
		c.c.SetWriteDeadline(d)
	}
	h.Length = uint32(len(p))
	h.Encode(c.wh[:])
	c.bufs[0], c.bufs[1] = c.wh[:], p
	bufs := net.Buffers(c.bufs[:])
	if len(p) == 0 {
		bufs = bufs[:1]
	}
	if _, err := bufs.WriteTo(c.c); err != nil {
		return t.ioErr(c, err, "sending")
	}
	return nil
}

func (t *tcpTransport) Recv(ctx context.Context, peer int, want *Header, dst []byte) error {
	c := t.conns[peer]
	if c == nil {
		return &Error{Kind: ErrInvalid, Rank: peer, Reporter: t.rank, Detail: "no connection"}
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if e := c.abort.Load(); e != nil {
		return *e
	}
	if d, ok := ctx.Deadline(); ok {
		c.c.SetReadDeadline(d)
	}
	if _, err := io.ReadFull(c.c, c.rh[:]); err != nil {
		return t.ioErr(c, err, "receiving")
	}
	got, err := DecodeHeader(c.rh[:], MaxPayload)
	if err != nil {
		return err
	}
	if err := checkHeader(want, &got); err != nil {
		return err
	}
	if len(dst) > 0 {
		if _, err := io.ReadFull(c.c, dst); err != nil {
			return t.ioErr(c, err, "receiving")
		}
	}
	return nil
}

func (t *tcpTransport) Abort(peers []int, err error) {
	for _, p := range peers {
		if p < 0 || p >= t.size || t.conns[p] == nil {
			continue
		}
		c := t.conns[p]
		c.abort.CompareAndSwap(nil, &err)
		c.c.SetDeadline(time.Unix(1, 0))
	}
}

func (t *tcpTransport) Close() error {
	t.closeOnce.Do(func() {
		if t.ln != nil {
			t.ln.Close()
		}
		for _, c := range t.conns {
			if c != nil {
				c.abort.CompareAndSwap(nil, &errClosedTransport)
				c.c.Close()
			}
		}
	})
	return nil
}

var errClosedTransport error = &Error{Kind: ErrClosed, Rank: -1, Reporter: -1, Detail: "transport closed"}
