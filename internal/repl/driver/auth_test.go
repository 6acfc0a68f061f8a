package driver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

type hsResult struct {
	ch    byte
	epoch uint64
	err   error
}

// runHandshake runs both sides over a pipe.
func runHandshake(t *testing.T, dial, acc HandshakeParams) (dialErr error, res hsResult) {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	done := make(chan hsResult, 1)
	go func() {
		ch, ep, err := acceptHandshake(c2, acc)
		if err != nil {
			c2.Close()
		}
		done <- hsResult{ch, ep, err}
	}()
	dialErr = DialHandshake(c1, chControl, 4242, dial)
	c1.Close()
	return dialErr, <-done
}

func TestHandshake(t *testing.T) {
	sec := []byte("a-shared-secret-of-both")
	a := HandshakeParams{Name: "vm1", NodeID: 1, Secret: sec}
	b := HandshakeParams{Name: "vm1", NodeID: 2, Secret: sec}

	// The same secret: both sides agree, the acceptor learns channel and attempt.
	if err, r := runHandshake(t, a, b); err != nil || r.err != nil || r.ch != chControl || r.epoch != 4242 {
		t.Fatalf("same secret: dial %v, accept %+v", err, r)
	}
	// Insecure on both sides also connects.
	if err, r := runHandshake(t, HandshakeParams{Name: "vm1", NodeID: 1}, HandshakeParams{Name: "vm1", NodeID: 2}); err != nil || r.err != nil {
		t.Fatalf("insecure pair: dial %v, accept %v", err, r.err)
	}

	cases := []struct {
		name         string
		dial, acc    HandshakeParams
		dialWant     string
		accWant      string
		accAuthError bool
	}{
		{"other secret", a, HandshakeParams{Name: "vm1", NodeID: 2, Secret: []byte("another-secret-entirely")}, "secrets differ", "no proof", true},
		{"dialer insecure", HandshakeParams{Name: "vm1", NodeID: 1}, b, "closed the connection", "no shared secret (insecure)", true},
		{"acceptor insecure", a, HandshakeParams{Name: "vm1", NodeID: 2}, "closed the connection", "the remote has a shared secret", true},
		{"own node id", HandshakeParams{Name: "vm1", NodeID: 2, Secret: sec}, b, "closed the connection", "own node id", true},
		{"other volume", HandshakeParams{Name: "vm2", NodeID: 1, Secret: sec}, b, "closed the connection", `volume "vm2"`, false},
	}
	for _, c := range cases {
		err, r := runHandshake(t, c.dial, c.acc)
		if err == nil || !strings.Contains(err.Error(), c.dialWant) {
			t.Errorf("%s: dialer: %v, want %q", c.name, err, c.dialWant)
		}
		var hr *helloRefused
		if r.err == nil || !strings.Contains(r.err.Error(), c.accWant) || !errors.As(r.err, &hr) || hr.auth != c.accAuthError {
			t.Errorf("%s: acceptor: %v, want %q (auth failure %v)", c.name, r.err, c.accWant, c.accAuthError)
		}
		if err != nil && bytes.Contains([]byte(err.Error()), sec) || r.err != nil && strings.Contains(r.err.Error(), string(sec)) {
			t.Errorf("%s: an error shows the secret", c.name)
		}
	}
}

// An intruder that speaks the protocol but cannot compute the proof (or
// replays an old one) is refused and gets a 0, and one speaking version 1
// (no authentication) is told to upgrade.
func TestHandshakeForgedProof(t *testing.T) {
	acc := HandshakeParams{Name: "vm1", NodeID: 2, Secret: []byte("a-shared-secret-of-both")}
	c1, c2 := net.Pipe()
	defer c1.Close()
	done := make(chan error, 1)
	go func() { _, _, err := acceptHandshake(c2, acc); c2.Close(); done <- err }()
	hello := binary.BigEndian.AppendUint32(nil, chanMagic)
	hello = append(hello, chanVersion, chData)
	hello = binary.BigEndian.AppendUint64(hello, 1)
	hello = binary.BigEndian.AppendUint16(hello, 3)
	hello = append(hello, "vm1"...)
	hello = binary.BigEndian.AppendUint64(hello, 7)
	hello = append(hello, authHMAC)
	hello = append(hello, make([]byte, nonceLen)...)
	c1.Write(hello)
	reply := make([]byte, 4+1+1+8+nonceLen+proofLen)
	if _, err := io.ReadFull(c1, reply); err != nil {
		t.Fatal(err)
	}
	c1.Write(make([]byte, proofLen)) // a guess
	var res [1]byte
	if _, err := io.ReadFull(c1, res[:]); err != nil || res[0] != 0 {
		t.Fatalf("forged proof answered %v %v, want 0", res, err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "wrong proof") {
		t.Fatalf("acceptor: %v", err)
	}

	c1, c2 = net.Pipe()
	defer c1.Close()
	go func() { _, _, err := acceptHandshake(c2, acc); c2.Close(); done <- err }()
	v1 := binary.BigEndian.AppendUint32(nil, chanMagic)
	v1 = append(v1, 1, chData)
	v1 = binary.BigEndian.AppendUint64(v1, 1)
	v1 = binary.BigEndian.AppendUint16(v1, 3)
	go c1.Write(append(v1, "vm1"...))
	if err := <-done; err == nil || !strings.Contains(err.Error(), "version 1") || !strings.Contains(err.Error(), "upgrade the peer") {
		t.Fatalf("version 1 hello: %v", err)
	}
}

func TestPeerFilter(t *testing.T) {
	addr := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	f, err := newPeerFilter(Settings{Peer: "10.0.0.2:7789"})
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]bool{"10.0.0.2:40000": true, "[::ffff:10.0.0.2]:1": true, "10.0.0.3:40000": false, "[::1]:5": false} {
		if got := f.allowed(addr(in)); got != want {
			t.Errorf("peer 10.0.0.2: %s allowed=%v", in, got)
		}
	}
	f, err = newPeerFilter(Settings{Peer: "10.0.0.2:7789", AcceptFrom: []string{"192.168.1.0/24", "fd00::1"}})
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]bool{"192.168.1.77:1": true, "[fd00::1]:1": true, "10.0.0.2:1": false} {
		if got := f.allowed(addr(in)); got != want {
			t.Errorf("accept_from: %s allowed=%v", in, got)
		}
	}
	// A name is resolved.
	f, err = newPeerFilter(Settings{Peer: "localhost:7789"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.allowed(addr("127.0.0.1:9")) || f.allowed(addr("10.9.9.9:9")) {
		t.Errorf("peer localhost: resolved %v", f.resolved)
	}
}

func TestLogLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := newLogLimiter(50 * time.Millisecond)
	for i := 0; i < 100; i++ {
		l.warn(log, "k", "refused", "i", i)
	}
	l.warn(log, "other", "refused other")
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines for 100 + 1 warnings:\n%s", n, buf.String())
	}
	time.Sleep(60 * time.Millisecond)
	l.warn(log, "k", "refused", "i", 100)
	if !strings.Contains(buf.String(), "suppressed_since_last=99") {
		t.Fatalf("the next line does not count the held back ones:\n%s", buf.String())
	}
}
