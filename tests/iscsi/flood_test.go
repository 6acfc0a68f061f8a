package iscsi

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/testutil"
)

func needTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		testutil.NeedTool(t, n)
	}
}

// floodNofile is the RLIMIT_NOFILE the flood tests give vmsan: a few
// hundred connections exhaust it.
const floodNofile = 256

// floodConns opens n TCP connections to addr that send nothing (or what
// send writes on each); they are closed by the returned function (and at
// cleanup).
func floodConns(t *testing.T, network, addr string, n int, send func(net.Conn)) (closeAll func()) {
	t.Helper()
	var cs []net.Conn
	var once sync.Once
	closeAll = func() {
		once.Do(func() {
			for _, c := range cs {
				c.Close()
			}
		})
	}
	t.Cleanup(closeAll)
	for range n {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			t.Logf("flood of %s: dial %d: %v", addr, len(cs), err)
			break
		}
		if send != nil {
			send(c)
		}
		cs = append(cs, c)
	}
	t.Logf("flood of %s: %d connections open", addr, len(cs))
	return closeAll
}

// alive fails the test when the daemon exited.
func (v *vmsan) alive(t *testing.T, when string) {
	t.Helper()
	select {
	case <-v.done:
		t.Fatalf("vmsan exited %s:\n%s", when, v.logTail())
	default:
	}
}

// waitLogLine waits up to d for a log line containing every one of want
// and returns it.
func (v *vmsan) waitLogLine(t *testing.T, d time.Duration, want ...string) string {
	t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		for _, l := range strings.Split(v.logText(), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return l
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no log line with %q within %v:\n%s", want, d, v.logTail())
		}
	}
}

// nbdWorks runs a write and a read-back over NBD with qemu-io.
func (v *vmsan) nbdWorks(t *testing.T, when string) {
	t.Helper()
	out, err := run(t, 30*time.Second, "qemu-io", "-f", "raw", "nbd://"+v.nbd+"/disk", "-c", "write -P 0x6b 1M 64k", "-c", "read -P 0x6b 1M 64k")
	if err != nil || strings.Contains(out, "fail") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io over NBD %s: %v\n%s\n%s", when, err, out, v.logTail())
	}
}

// iscsiWorks runs iscsi-inq (libiscsi) against LUN 0.
func (v *vmsan) iscsiWorks(t *testing.T, when string, timeout time.Duration) {
	t.Helper()
	out, err := run(t, timeout, "iscsi-inq", v.url(rawUser+"%"+rawSecret, 0))
	if err != nil || !strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("iscsi-inq %s: %v\n%s\n%s", when, err, out, v.logTail())
	}
}

// TestPortalFlood: with RLIMIT_NOFILE 256, (1) 400 silent connections to
// the iSCSI portal (more than the process has descriptors) do not stop
// the daemon, and NBD keeps working meanwhile: connections still logging
// in are capped (iscsi.max_pending_logins, at most an eighth of the
// descriptors), the rest are closed at accept; (2) when the descriptors
// run out anyway (400 connections to the NBD port, the data path, which
// is not capped that low), an iSCSI connection arriving meanwhile gets
// EMFILE at accept: logged and retried, not the end of the daemon; once
// the flood ends both front ends work again. Before, the first EMFILE on
// the portal shut the whole daemon down ("listener failed").
func TestPortalFlood(t *testing.T) {
	needTools(t, "qemu-io", "iscsi-inq")
	v := startVmsanNofile(t, t.TempDir(), "", fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret), floodNofile)

	// (1) The portal flooded.
	end := floodConns(t, "tcp", v.addr, 400, nil)
	// The cap was reached: the daemon is in the middle of the flood (a
	// condition, not a guessed second).
	v.waitLogLine(t, 10*time.Second, "too many connections logging in (iscsi.max_pending_logins)")
	v.alive(t, "after 400 silent connections to the iSCSI portal")
	v.nbdWorks(t, "during the portal flood")
	if n := fdCount(t, v.cmd.Process.Pid); n >= floodNofile {
		t.Errorf("daemon holds %d descriptors during the portal flood, its limit is %d", n, floodNofile)
	}
	if m := scrape(t, v.metrics); m[`vmsan_frontend_connections_refused_total{frontend="iscsi"}`] < 1 {
		t.Errorf("no refused iSCSI connection counted during the portal flood")
	}
	end()
	v.iscsiWorks(t, "after the portal flood", 30*time.Second)

	// (2) Descriptors exhausted through the NBD port (connections that
	// completed the handshake: those still in it are capped).
	end = floodNBD(t, v.nbd, 400)
	v.waitLogLine(t, 10*time.Second, "nbd: accept failed, retrying", "too many open files")
	late := floodConns(t, "tcp", v.addr, 3, nil)
	v.waitLogLine(t, 10*time.Second, "iscsi: accept failed, retrying", "too many open files")
	v.alive(t, "after EMFILE on the iSCSI portal")
	end()
	late()
	v.iscsiWorks(t, "after the descriptor flood", 30*time.Second)
	v.nbdWorks(t, "after the descriptor flood")
	v.alive(t, "at the end")
}

// floodNBD opens up to n NBD connections to addr that complete the
// handshake and then sit idle (connections still in the handshake are
// capped by max_pending_handshakes, so only these use up the daemon's
// descriptors); it stops at the first that does not get through. They
// are closed by the returned function (and at cleanup).
func floodNBD(t *testing.T, addr string, n int) (closeAll func()) {
	t.Helper()
	var cs []*client.Conn
	var once sync.Once
	closeAll = func() {
		once.Do(func() {
			for _, c := range cs {
				c.Close()
			}
		})
	}
	t.Cleanup(closeAll)
	for range n {
		c, err := client.Dial(context.Background(), "nbd://"+addr+"/disk", &client.Options{Connections: 1, DialTimeout: 2 * time.Second})
		if err != nil {
			t.Logf("NBD flood of %s: connection %d: %v", addr, len(cs), err)
			break
		}
		cs = append(cs, c)
	}
	t.Logf("NBD flood of %s: %d idle connections", addr, len(cs))
	return closeAll
}

// TestNBDHandshakeFlood: with RLIMIT_NOFILE 256, 400 connections to the
// NBD port that never answer the greeting do not exhaust the daemon's
// descriptors: at most max_pending_handshakes (bounded by an eighth of
// the limit) are kept, each new one past it closes the oldest (logged,
// rate limited), and those kept are closed when handshake_timeout
// expires. qemu-io and nbdinfo work during the flood (their handshakes
// complete before they are the oldest). Before, every silent
// connection was kept for the handshake timeout (up to max_connections,
// 1024), the descriptors ran out and no client could connect.
func TestNBDHandshakeFlood(t *testing.T) {
	needTools(t, "qemu-io", "nbdinfo")
	const hsTimeout = 3 * time.Second
	v := startVmsanNofile(t, t.TempDir(), fmt.Sprintf("nbd:\n  handshake_timeout: %v\n", hsTimeout),
		fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret), floodNofile)
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 400 {
		c, err := net.DialTimeout("tcp", v.nbd, 2*time.Second)
		if err != nil {
			t.Logf("flood: dial %d: %v", len(flood), err)
			break
		}
		flood = append(flood, c)
	}
	t.Logf("%d silent connections to the NBD port", len(flood))
	time.Sleep(500 * time.Millisecond) // let the daemon accept what it will
	v.alive(t, "during the handshake flood")
	if n := fdCount(t, v.cmd.Process.Pid); n >= floodNofile {
		t.Errorf("daemon holds %d descriptors during the handshake flood, its limit is %d", n, floodNofile)
	}
	v.nbdWorks(t, "during the handshake flood")
	if out, err := run(t, 20*time.Second, "nbdinfo", "--no-content", "nbd://"+v.nbd+"/disk"); err != nil || !strings.Contains(out, fmt.Sprint(volSize)) {
		t.Errorf("nbdinfo during the handshake flood: %v\n%s\n%s", err, out, v.logTail())
	}
	v.waitLogLine(t, 10*time.Second, "too many connections still in the handshake (max_pending_handshakes)")
	// Every silent connection is closed by the daemon: at once past the
	// cap, after the handshake timeout within it. (The bound only stops a
	// broken daemon from hanging the test.)
	var wg sync.WaitGroup
	var open atomic.Int64
	for _, c := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(hsTimeout + 30*time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := open.Load(); n > 0 {
		t.Errorf("%d of %d silent connections still open %v after the handshake timeout", n, len(flood), 30*time.Second)
	}
	refusals := strings.Count(v.logText(), "max_pending_handshakes")
	t.Logf("refusal log lines: %d", refusals)
	if refusals > 5 {
		t.Errorf("%d refusal log lines for one flood: not rate-limited", refusals)
	}
	if m := scrape(t, v.metrics); m[`vmsan_frontend_connections_refused_total{frontend="nbd"}`] < 1 {
		t.Errorf("no refused NBD connection counted during the handshake flood")
	}
	v.nbdWorks(t, "after the handshake flood")
	v.alive(t, "at the end")
}

// TestMetricsIdleFlood: with RLIMIT_NOFILE 256, 400 keep-alive
// connections to the metrics listener that each sent one request and then
// sit idle do not starve the data path or the control socket: the
// metrics listener serves a bounded number of connections (at most a
// sixteenth of the descriptors), the rest wait in the kernel's backlog,
// and NBD clients and `vmsan status` work meanwhile. Before, every
// connection was accepted and kept until the descriptors ran out.
func TestMetricsIdleFlood(t *testing.T) {
	needTools(t, "nbdinfo")
	v := startVmsanNofile(t, t.TempDir(), "", fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret), floodNofile)
	floodConns(t, "tcp", v.metrics, 400, func(c net.Conn) {
		c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: vmsan\r\n\r\n")
	})
	time.Sleep(time.Second)
	v.alive(t, "after the metrics flood")
	if n := fdCount(t, v.cmd.Process.Pid); n >= floodNofile-8 {
		t.Errorf("daemon holds %d descriptors during the metrics flood, its limit is %d", n, floodNofile)
	}
	if out, err := run(t, 20*time.Second, "nbdinfo", "--no-content", "nbd://"+v.nbd+"/disk"); err != nil || !strings.Contains(out, fmt.Sprint(volSize)) {
		t.Errorf("nbdinfo during the metrics flood: %v\n%s\n%s", err, out, v.logTail())
	}
	out, err := run(t, 20*time.Second, vmsanBin, "status", "--data-dir", filepath.Join(v.dir, "data"))
	if err != nil {
		t.Errorf("vmsan status during the metrics flood: %v\n%s", err, out)
	}
}

// TestControlTrickledBody: a control socket client that sends a complete
// request header and then its body one byte every half second gets 408
// (or the connection closed) within three times the body timeout (10 s),
// instead of holding its handler and connection for as long as it likes.
func TestControlTrickledBody(t *testing.T) {
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret))
	c, err := net.Dial("unix", filepath.Join(v.dir, "data", "control.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"name":"trickled","size":"1M"}` + strings.Repeat(" ", 200)
	fmt.Fprintf(c, "POST /v1/volumes HTTP/1.1\r\nHost: vmsan\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	c.SetReadDeadline(start.Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	took := time.Since(start)
	t.Logf("control socket answered %q (%v) after %v", strings.TrimSpace(line), err, took.Round(time.Millisecond))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a trickled request body held the control connection for %v", took.Round(time.Second))
	}
	if err == nil && !strings.Contains(line, " 408 ") {
		t.Fatalf("trickled body answered %q, want 408", line)
	}
	if _, err := os.Stat(filepath.Join(v.dir, "data", "volumes", "trickled.raw")); err == nil {
		t.Fatal("the trickled request created its volume")
	}
}

// write16 is a WRITE(16) CDB.
func write16(lba uint64, blocks uint32) [16]byte {
	var c [16]byte
	c[0] = 0x8a
	binary.BigEndian.PutUint64(c[2:], lba)
	binary.BigEndian.PutUint32(c[10:], blocks)
	return c
}

// withholder is a session that announces WRITEs and never answers their
// R2Ts, while answering the target's NOP-In pings so that it looks alive.
type withholder struct {
	r      *raw
	local  string
	mu     sync.Mutex
	r2ts   int
	status []pdu.SCSIStatus
	closed chan struct{}
}

func startWithholder(t *testing.T, addr string, writes int) *withholder {
	r := ffp(t, addr, "InitialR2T", "Yes")
	w := &withholder{r: r, local: r.c.LocalAddr().String(), closed: make(chan struct{})}
	for range writes {
		r.send(r.cmd(write16(0, hogWrite/512), false, true, hogWrite), nil)
	}
	go func() {
		defer close(w.closed)
		for {
			r.c.SetReadDeadline(time.Now().Add(time.Minute))
			f, err := r.rd.Read()
			if err != nil {
				return
			}
			w.mu.Lock()
			switch h := f.Header.(type) {
			case *pdu.NOPIn:
				if h.ITT == pdu.ReservedTag {
					b, err := pdu.AppendPDU(nil, &pdu.NOPOut{Immediate: true, ITT: pdu.ReservedTag, TTT: h.TTT, LUN: h.LUN, CmdSN: r.cmdSN}, nil, nil, r.dig)
					if err == nil {
						r.write(b)
					}
				}
			case *pdu.R2T:
				w.r2ts++
			case *pdu.SCSIResponse:
				w.status = append(w.status, h.Status)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// TestWithheldDataOut: sessions that announce 32 MiB WRITE(16)s and never
// answer the R2Ts, but answer NOP-In, cannot pin the daemon-wide
// in-flight budget. Three such sessions announce 192 MiB against a
// 128 MiB budget; meanwhile an NBD client's 64 KiB write completes and
// INQUIRY works (within three times the 3 s dataout_timeout), and after
// the timeout each withholding connection is closed, its budget given
// back, with a log line naming the session (initiator, ISID, address).
// Before, they held the whole budget: the NBD write waited for as long
// as they liked and INQUIRY got BUSY, with nothing logged.
func TestWithheldDataOut(t *testing.T) {
	needTools(t, "iscsi-inq")
	const budget = 128 << 20
	const bound = 3 * 3 * time.Second // three times the default dataout_timeout
	v := startVmsanIn(t, t.TempDir(), fmt.Sprintf("inflight_budget: %d\n", budget),
		fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret))
	used := func() float64 { return scrape(t, v.metrics)["vmsan_inflight_budget_used_bytes"] }
	var ws []*withholder
	for range 3 {
		ws = append(ws, startWithholder(t, v.addr, 2))
	}
	waitFor(t, "the withheld writes' reservations", func() bool { return used() >= hogWrite })
	time.Sleep(200 * time.Millisecond) // the rest of the announced writes
	t.Logf("budget used by withheld writes: %.0f MiB of %d", used()/(1<<20), budget>>20)

	// An NBD write of 64 KiB.
	start := time.Now()
	c := nbdDial(t, v.nbd)
	b := proto.AppendRequest(nil, proto.Request{Type: proto.CmdWrite, Cookie: 7, Length: 64 << 10})
	b = append(b, make([]byte, 64<<10)...)
	c.SetDeadline(time.Now().Add(bound))
	if _, err := c.Write(b); err != nil {
		t.Fatalf("NBD write: %v", err)
	}
	reply := make([]byte, 16)
	if _, err := io.ReadFull(c, reply); err != nil {
		t.Fatalf("NBD 64 KiB write next to the withheld iSCSI writes: no reply within %v (%v)", bound, err)
	}
	if e := binary.BigEndian.Uint32(reply[4:]); e != 0 {
		t.Fatalf("NBD write: error %d", e)
	}
	t.Logf("NBD 64 KiB write completed in %v", time.Since(start).Round(time.Millisecond))
	v.iscsiWorks(t, "next to the withheld writes", bound)

	// The withholders whose writes were admitted (they got R2Ts) are
	// closed and named in the log; those whose writes were all refused
	// hold nothing and may stay.
	var named *withholder
	for _, w := range ws {
		w.mu.Lock()
		admitted, st := w.r2ts > 0, w.status
		w.mu.Unlock()
		t.Logf("withholder %s: admitted %v, refused with %v", w.local, admitted, st)
		if !admitted {
			continue
		}
		select {
		case <-w.closed:
		case <-time.After(bound):
			t.Fatalf("withholding session %s still open after %v", w.local, bound)
		}
		named = w
	}
	if named == nil {
		t.Fatal("no withheld write was admitted")
	}
	line := v.waitLogLine(t, 5*time.Second, "dataout_timeout", "initiator="+rawIQN, fmt.Sprintf("isid=%x", named.r.isid[:]), "remote="+named.local)
	t.Logf("log: %s", line)
	waitFor(t, "the budget to be given back", func() bool { return used() == 0 })
	v.nbdWorks(t, "after the withholders left")
}
