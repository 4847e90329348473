package transport_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/transport"
)

// TestTCPRefusesWithoutSecret: a data connection that cannot prove the job's
// secret is dropped before a byte of data is accepted — a stranger speaking the
// protocol without the secret, and a rank of another job (another secret) — and
// the job's own ranks then connect and compute as usual.
func TestTCPRefusesWithoutSecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	secret := []byte("this job's secret, 32 bytes long")
	ln0, err := transport.TCPListen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln1, err := transport.TCPListen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{ln0.Addr().String(), ln1.Addr().String()}

	type result struct {
		tr  collective.Transport
		err error
	}
	rank0 := make(chan result, 1)
	go func() {
		tr, err := transport.NewTCPTransport(ctx, 0, 2, ln0, addrs, secret, "job-a", nil)
		rank0 <- result{tr, err}
	}()

	// A stranger who knows the protocol but not the secret: its answer to the
	// challenge is wrong, and the connection is closed.
	c, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, 4+8+4+4+32)
	copy(hello, "MRT1")
	binary.LittleEndian.PutUint32(hello[12:], 1)
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.ReadFull(c, make([]byte, 64)) // the challenge, if any
	c.Write(make([]byte, 32))        // a guess
	if n, err := c.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Errorf("the stranger's connection is still open (read %d bytes, %v)", n, err)
	}
	c.Close()

	// A rank of another job (another secret) fails its handshake.
	other, err := transport.TCPListen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = transport.NewTCPTransport(octx, 1, 2, other, addrs, []byte("another job's secret, 32 bytes!"), "job-a", nil)
	ocancel()
	if err == nil {
		t.Fatal("a rank with another secret joined the job's data plane")
	}

	// The job's own rank 1 connects, and the pair computes.
	tr1, err := transport.NewTCPTransport(ctx, 1, 2, ln1, addrs, secret, "job-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	r0 := <-rank0
	if r0.err != nil {
		t.Fatal(r0.err)
	}
	ctls := collective.LocalControls(2)
	ws := make([]*collective.World, 2)
	for i, tr := range []collective.Transport{r0.tr, tr1} {
		if ws[i], err = collective.NewWorld(tr, ctls[i], collective.Options{Job: "job-a"}); err != nil {
			t.Fatal(err)
		}
		defer ws[i].Close()
	}
	errs := make(chan error, 2)
	for i, w := range ws {
		go func() {
			c, err := w.WorldGroup(ctx)
			if err != nil {
				errs <- err
				return
			}
			buf := []float32{float32(i + 1)}
			if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
				errs <- err
				return
			}
			if buf[0] != 3 {
				errs <- errors.New("wrong sum")
				return
			}
			errs <- nil
		}()
	}
	for range ws {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
