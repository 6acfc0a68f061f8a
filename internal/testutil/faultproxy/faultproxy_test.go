package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
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
