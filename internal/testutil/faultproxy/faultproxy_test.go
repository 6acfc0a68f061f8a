package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func TestForwardDelayBlackholeReset(t *testing.T) {
	p, err := New("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := []byte("hello through the proxy")
	c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %q %v", got, err)
	}

	// Delay: a round trip takes at least two one-way delays.
	p.SetDelay(30 * time.Millisecond)
	t0 := time.Now()
	c.Write(msg)
	io.ReadFull(c, got)
	if el := time.Since(t0); el < 60*time.Millisecond {
		t.Fatalf("round trip %v with 30ms one-way delay", el)
	}
	p.SetDelay(0)

	// Blackhole: nothing arrives while on; everything arrives after.
	p.Blackhole(true)
	c.Write(msg)
	c.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if n, _ := c.Read(got); n != 0 {
		t.Fatal("data crossed a blackhole")
	}
	c.SetReadDeadline(time.Time{})
	p.Blackhole(false)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after blackhole: %q %v", got, err)
	}

	// Reset: the client sees the connection die.
	p.Reset()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(got); err == nil {
		t.Fatal("read succeeded after reset")
	}

	// Drop: new connections are closed at once.
	p.Drop(true)
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		c2.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c2.Read(got); err == nil {
			t.Fatal("dropped connection delivered data")
		}
		c2.Close()
	}
}

func TestBandwidth(t *testing.T) {
	p, err := New("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetBandwidth(1 << 20) // 1 MiB/s each way
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out, in := make([]byte, 256<<10), make([]byte, 256<<10)
	t0 := time.Now()
	go c.Write(out)
	io.ReadFull(c, in)
	// 256 KiB at 1 MiB/s is at least ~250 ms (a lower bound only).
	if el := time.Since(t0); el < 200*time.Millisecond {
		t.Fatalf("256 KiB crossed a 1 MiB/s link in %v", el)
	}
}

// TestBlackholeHoldsClose: an endpoint closing during a blackhole is not
// seen by the other until it lifts (a silent network carries no FIN),
// also when no data in that direction is held with it; data the other
// side sent into the blackhole meets the closed endpoint then.
func TestBlackholeHoldsClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err := New("127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	c.Write([]byte("stale"))
	s.Close()
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	b := make([]byte, 16)
	if n, err := c.Read(b); n != 0 || !errors.As(err, new(net.Error)) {
		t.Fatalf("during the blackhole: %d bytes, %v; want a timeout", n, err)
	}
	p.Blackhole(false)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(b); n != 0 || errors.As(err, new(net.Error)) {
		t.Fatalf("after the blackhole: %d bytes, %v; want the close", n, err)
	}
}

// TestFollowTarget: with the target dead, a client of a following proxy
// is refused (as by the dead node's own host), never accepted and reset;
// once the target listens again on its address, the proxy forwards again
// on its own address.
func TestFollowTarget(t *testing.T) {
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := tln.Addr().String()
	serve := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}
	go serve(tln)
	p, err := New("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.FollowTarget(true)
	downs := make(chan struct{}, 10)
	p.SetLog(func(format string, args ...any) {
		if strings.Contains(fmt.Sprintf(format, args...), "down: not listening") {
			downs <- struct{}{}
		}
	})
	echo := func() error {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		b := make([]byte, 1)
		_, err = io.ReadFull(c, b)
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("echo through the proxy: %v", err)
	}

	// The target dies while a client is connected: the proxy notices when
	// the connection ends and refuses the next client at once.
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for p.Conns() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	tln.Close()
	p.Reset() // as the dying target's connections close
	select {
	case <-downs:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not notice its target down after its connection ended")
	}
	if err := echo(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("client of a proxy whose target is down: %v, want connection refused", err)
	}

	// The target comes back and dies again with no client connected:
	// within a few attempts (the first may be accepted while the proxy
	// learns that the target is down), clients are refused.
	tln, err = net.Listen("tcp", target)
	if err != nil {
		t.Skipf("target address taken meanwhile: %v", err) // skip: port
	}
	go serve(tln)
	for deadline := time.Now().Add(10 * time.Second); echo() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not forward again after the target came back")
		}
	}
	tln.Close()
	refused := false
	for i := 0; i < 50 && !refused; i++ {
		err := echo()
		if err == nil {
			t.Fatal("echo through the proxy with the target down")
		}
		refused = errors.Is(err, syscall.ECONNREFUSED)
		time.Sleep(20 * time.Millisecond)
	}
	if !refused {
		t.Fatal("the proxy kept accepting connections with its target down")
	}

	// The target comes back on its address: the proxy forwards again.
	tln, err = net.Listen("tcp", target)
	if err != nil {
		t.Skipf("target address taken meanwhile: %v", err) // skip: port
	}
	defer tln.Close()
	go serve(tln)
	deadline := time.Now().Add(10 * time.Second)
	for err := echo(); err != nil; err = echo() {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not forward again after the target came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRefuse: while refusing, a client's connect fails with connection
// refused (never accepted and then reset) and an open connection is
// reset; afterwards the proxy forwards again on the same address.
func TestRefuse(t *testing.T) {
	p, err := New("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	}
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := echo(open); err != nil {
		t.Fatalf("echo through the proxy: %v", err)
	}
	p.Refuse(true)
	if err := echo(open); err == nil {
		t.Fatal("a connection open before Refuse still forwards")
	}
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", p.Addr())
		if err == nil {
			c.Close()
			t.Fatalf("connect %d while refusing was accepted", i)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect while refusing: %v, want connection refused", err)
		}
	}
	p.Refuse(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", p.Addr())
		if err == nil {
			err = echo(c)
			c.Close()
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not forward again after Refuse(false): %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
