package netutil

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failing is a listener whose Accept fails with EMFILE n times, then
// accepts from the real listener.
type failing struct {
	net.Listener
	mu sync.Mutex
	n  int
}

func (f *failing) Accept() (net.Conn, error) {
	f.mu.Lock()
	if f.n > 0 {
		f.n--
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRetry: accept errors are retried (the connection after them is
// returned), logged once per second with the count of the others, and
// Close ends Accept with an error, also during a pause.
func TestRetry(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuf
	ln := Retry(&failing{Listener: inner, n: 8}, slog.New(slog.NewTextHandler(&out, nil)), "test")
	go func() {
		if c, err := net.Dial("tcp", inner.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(5 * time.Second)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept after 8 EMFILEs: %v", err)
	}
	c.Close()
	if n := strings.Count(out.String(), "test: accept failed, retrying"); n < 1 || n > 2 {
		t.Errorf("%d log lines for 8 failures within about 1.3 s, want 1 or 2 (rate-limited):\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "too many open files") {
		t.Errorf("log does not name the error:\n%s", out.String())
	}

	// Close during a pause ends Accept at once.
	ln2 := Retry(&failing{Listener: inner, n: 1 << 30}, nil, "test")
	done := make(chan error, 1)
	go func() { _, err := ln2.Accept(); done <- err }()
	time.Sleep(1500 * time.Millisecond) // in a 1 s pause by now
	start := time.Now()
	ln2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("Accept returned %v after Close", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}

// TestLimit: past n open connections Accept waits until one closes.
func TestLimit(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Limit(inner, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, second := <-accepted, <-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted with two open")
	case <-time.After(300 * time.Millisecond):
	}
	first.Close()
	first.Close() // a second Close frees nothing more
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	second.Close()
	ln.Close()
	for range accepted {
	}
}

func TestShare(t *testing.T) {
	for _, c := range []struct {
		def   int
		limit uint64
		div   int
		want  int
	}{{64, 0, 16, 64}, {64, 256, 16, 16}, {64, 1 << 20, 16, 64}, {64, 32, 16, 4}} {
		if got := Share(c.def, c.limit, c.div, 4); got != c.want {
			t.Errorf("Share(%d, %d, %d) = %d, want %d", c.def, c.limit, c.div, got, c.want)
		}
	}
}

func TestFDReserve(t *testing.T) {
	r := NewFDReserve(3)
	if n := r.Held(); n != 3 {
		t.Fatalf("held %d, want 3", n)
	}
	if n := r.Release(); n != 3 || r.Held() != 0 {
		t.Fatalf("released %d (held %d), want 3 (0)", n, r.Held())
	}
	if n := r.Release(); n != 0 {
		t.Fatalf("second release freed %d", n)
	}
	if n := r.Refill(); n != 3 {
		t.Fatalf("refilled to %d, want 3", n)
	}
	r.Release()
	var nilRes *FDReserve
	if nilRes.Release() != 0 || nilRes.Refill() != 0 {
		t.Fatal("nil reserve holds descriptors")
	}
	if !OutOfFDs(&net.OpError{Op: "accept", Err: os.NewSyscallError("accept", syscall.EMFILE)}) || OutOfFDs(syscall.EIO) {
		t.Fatal("OutOfFDs")
	}
}
