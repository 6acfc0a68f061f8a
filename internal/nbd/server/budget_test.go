package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/volrt"
)

// TestSharedBudgetBackpressure: two connections share a daemon-wide budget
// that holds one maximum-size request. While one connection holds it (a
// WRITE whose payload is half sent), the other's READ is not served (its
// reader waits: backpressure, nothing above the cap); when the first
// completes, the second is served and everything is given back.
func TestSharedBudgetBackpressure(t *testing.T) {
	const maxP = 1 << 20
	var global volrt.Budget
	global.Init(maxP)
	reg := &testReg{devs: map[string]export.Device{"disk": newTestDev("disk", 8<<20)}}
	_, addr := startServer(t, Config{Registry: reg, MaxPayload: maxP, Budget: &global})

	a := dialRaw(t, addr)
	a.negotiate("disk", false)
	payload := make([]byte, maxP)
	a.request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Length: maxP}, payload[:maxP/2])
	waitUntil(t, "the WRITE's reservation", func() bool { return global.Used() == maxP })

	b := dialRaw(t, addr)
	b.negotiate("disk", false)
	b.request(proto.Request{Type: proto.CmdRead, Cookie: 2, Offset: 0, Length: 4096}, nil)
	waitUntil(t, "the READ to wait for the budget", func() bool { return global.Stats().Waits > 0 })
	b.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := io.ReadFull(b.c, make([]byte, 1)); err == nil {
		t.Fatal("READ answered while the shared budget was spent")
	}
	if u := global.Used(); u != maxP {
		t.Fatalf("shared budget holds %d, want %d (the cap)", u, maxP)
	}

	a.send(payload[maxP/2:])
	a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rp, err := a.readReply(nil, nil); err != nil || rp.cookie != 1 || rp.errno != 0 {
		t.Fatalf("WRITE reply %+v, %v", rp, err)
	}
	b.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rp, err := b.readReply(map[uint64]uint32{2: 4096}, map[uint64]uint64{2: 0}); err != nil || rp.cookie != 2 || rp.errno != 0 {
		t.Fatalf("READ reply after the WRITE finished: %+v, %v", rp, err)
	}
	waitUntil(t, "the budget to be given back", func() bool { return global.Used() == 0 })
}

// TestMaxConns: past MaxConns a connection is closed before the greeting
// and counted; once one leaves, a new one is served.
func TestMaxConns(t *testing.T) {
	reg := &testReg{devs: map[string]export.Device{"disk": newTestDev("disk", 1<<20)}}
	srv, addr := startServer(t, Config{Registry: reg, MaxConns: 2})
	first := dialRaw(t, addr)
	dialRaw(t, addr)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("third connection: read %d bytes, err %v; want closed before the greeting", len(b), err)
	}
	if n := srv.Stats().ConnsRefused; n != 1 {
		t.Fatalf("ConnsRefused %d, want 1", n)
	}
	first.c.Close()
	waitUntil(t, "the first connection to end", func() bool { return srv.Stats().ActiveConns == 1 })
	dialRaw(t, addr).negotiate("disk", false)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxPendingHandshakes: with MaxPendingHandshakes connections
// sitting silent in the handshake, a new connection closes the oldest of
// them (counted) and itself gets through its handshake; the silent ones
// left are closed when HandshakeTimeout expires, and transmission
// connections do not count against the cap.
func TestMaxPendingHandshakes(t *testing.T) {
	reg := &testReg{devs: map[string]export.Device{"disk": newTestDev("disk", 1<<20)}}
	srv, addr := startServer(t, Config{Registry: reg, MaxPendingHandshakes: 3, HandshakeTimeout: time.Second})
	// In transmission: not counted.
	for range 3 {
		dialRaw(t, addr).negotiate("disk", false)
	}
	var silent []*rawClient
	for range 3 {
		silent = append(silent, dialRaw(t, addr))
	}
	waitUntil(t, "three connections in the handshake", func() bool { return srv.Stats().ActiveConns == 6 })
	late := dialRaw(t, addr)
	silent[0].c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(silent[0].c); err != nil || len(b) != 0 {
		t.Fatalf("oldest silent connection: read %d bytes, err %v; want closed", len(b), err)
	}
	if n := srv.Stats().ConnsRefused; n != 1 {
		t.Fatalf("ConnsRefused %d, want 1", n)
	}
	late.negotiate("disk", false)
	for i, rc := range silent[1:] {
		rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := io.ReadAll(rc.c); err != nil || len(b) != 0 {
			t.Fatalf("silent connection %d after the handshake timeout: read %d bytes, err %v; want closed", i+1, len(b), err)
		}
	}
	waitUntil(t, "the silent connections to end", func() bool { return srv.Stats().ActiveConns == 4 })
}

// TestHandshakeTimeoutTrickle: the handshake timeout runs from accept, so
// a client that trickles its options (a byte every 50 ms, each well
// inside any per-read timeout) is closed when it expires, before its
// handshake completes, and leaves the pending count.
func TestHandshakeTimeoutTrickle(t *testing.T) {
	reg := &testReg{devs: map[string]export.Device{"disk": newTestDev("disk", 1<<20)}}
	srv, addr := startServer(t, Config{Registry: reg, HandshakeTimeout: 500 * time.Millisecond})
	rc := dialRaw(t, addr)
	msg := proto.AppendClientFlags(nil, uint32(proto.FlagCFixedNewstyle|proto.FlagCNoZeroes))
	// Several GO options' worth: far more bytes than fit in the timeout.
	for range 4 {
		msg = proto.AppendOption(msg, proto.OptList, nil)
	}
	sent := 0
	for ; sent < len(msg); sent++ {
		if _, err := rc.c.Write(msg[sent : sent+1]); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sent == len(msg) {
		t.Fatalf("the whole trickled handshake (%d bytes) was accepted", len(msg))
	}
	waitUntil(t, "the trickling connection to end", func() bool { return srv.Stats().ActiveConns == 0 })
	srv.mu.Lock()
	n := srv.pending.Len()
	srv.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d connections still counted in the handshake", n)
	}
}
