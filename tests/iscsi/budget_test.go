package iscsi

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/testutil"
)

// Limits of TestDaemonWideBudget's daemon.
const (
	budgetTotal = 96 << 20 // inflight_budget
	hogWrite    = 32 << 20 // each hog command's length (the largest allowed)
	maxNBDConns = 4        // max_connections
	maxSessions = 6        // iscsi.max_sessions
)

// TestDaemonWideBudget: clients of both front ends that announce large
// writes and never finish them hold at most inflight_budget together
// (each connection's own budget alone would let them hold N times 64 MiB):
// two NBD connections send 32 MiB writes but the last byte, five iSCSI
// sessions announce two 32 MiB writes each and answer every R2T but the
// last. Only what fits is admitted (iSCSI answers the rest BUSY or TASK
// SET FULL; a third NBD connection stops being read), the daemon's RSS
// stays within the budget plus a bound, the connection and session limits
// answer as specified, nbdinfo works meanwhile (no payload needed), and
// qemu-io over both front ends works once the hogs leave.
func TestDaemonWideBudget(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-io")
	// The second argument is YAML after the volume list: top-level keys.
	v := startVmsanIn(t, testutil.DiskTempDir(t),
		fmt.Sprintf("inflight_budget: %d\nmax_connections: %d\n", budgetTotal, maxNBDConns),
		// The hogs withhold their last burst for the whole test: no
		// Data-Out timeout here (TestWithheldDataOut's).
		fmt.Sprintf("    auth: {user: %s, secret: %q}\n    max_sessions: %d\n    dataout_timeout: 10m\n", rawUser, rawSecret, maxSessions))
	pid := v.cmd.Process.Pid
	rss0 := procStatusKiB(t, pid, "VmRSS")
	used := func() float64 { return scrape(t, v.metrics)["vmsan_inflight_budget_used_bytes"] }

	// NBD: two writes held with all but their last byte sent.
	var nbdHogs []net.Conn
	for range 2 {
		c := nbdDial(t, v.nbd)
		nbdSendWrite(t, c, hogWrite, hogWrite-1)
		nbdHogs = append(nbdHogs, c)
	}
	waitFor(t, "the NBD hogs' reservations", func() bool { return used() >= 2*hogWrite })

	// iSCSI: five sessions, two writes each.
	var sessions []*raw
	admitted, busy, full := 0, 0, 0
	for range maxSessions - 1 {
		r := ffp(t, v.addr, "InitialR2T", "Yes")
		a, b, f := iscsiHog(t, r, 2)
		admitted, busy, full = admitted+a, busy+b, full+f
		sessions = append(sessions, r)
	}
	m := scrape(t, v.metrics)
	rss1 := procStatusKiB(t, pid, "VmRSS")
	t.Logf("iSCSI hog writes admitted %d, BUSY %d, TASK SET FULL %d; budget used %.0f of %d; RSS %d KiB (%+d KiB)",
		admitted, busy, full, m["vmsan_inflight_budget_used_bytes"], budgetTotal, rss1, rss1-rss0)
	if held := 2*hogWrite + admitted*hogWrite; held > budgetTotal {
		t.Errorf("%d iSCSI hog writes admitted next to the NBD ones: %d MiB held, over the %d MiB budget",
			admitted, held>>20, budgetTotal>>20)
	}
	if busy == 0 || full == 0 {
		t.Errorf("want both BUSY (session with nothing in flight) and TASK SET FULL (session with a command in flight); got %d, %d", busy, full)
	}
	if u := m["vmsan_inflight_budget_used_bytes"]; u > budgetTotal || u < 2*hogWrite {
		t.Errorf("vmsan_inflight_budget_used_bytes %.0f, want between %d and %d", u, 2*hogWrite, budgetTotal)
	}
	if m["vmsan_inflight_budget_bytes"] != budgetTotal || m["vmsan_inflight_budget_refused_total"] < float64(busy+full) {
		t.Errorf("budget metrics: limit %.0f, refused %.0f; want %d, >= %d", m["vmsan_inflight_budget_bytes"],
			m["vmsan_inflight_budget_refused_total"], budgetTotal, busy+full)
	}
	// What is held is resident (written); the rest of the heap is
	// bounded by the garbage collector (up to about as much again) and
	// per-connection buffers. Without the daemon-wide budget this run
	// holds 384 MiB.
	if d := rss1 - rss0; d > (2*budgetTotal+32<<20)>>10 {
		t.Errorf("RSS grew %d KiB with the hogs, want at most twice the %d MiB budget plus 32 MiB", d, budgetTotal>>20)
	}

	// A third NBD write does not fit: its connection stops being read.
	waits0 := m["vmsan_inflight_budget_waits_total"]
	paused := nbdDial(t, v.nbd)
	nbdSendWrite(t, paused, hogWrite, 0)
	waitFor(t, "the third NBD write to wait for the budget", func() bool {
		return scrape(t, v.metrics)["vmsan_inflight_budget_waits_total"] > waits0
	})

	// Meanwhile a client that needs no payload memory still works
	// (nbdinfo's default content probe reads, so it would wait).
	if out, err := run(t, 30*time.Second, "nbdinfo", "--no-content", "nbd://"+v.nbd+"/disk"); err != nil || !strings.Contains(out, "67108864") {
		t.Errorf("nbdinfo next to the hogs: %v\n%s", err, out)
	}
	// The connection limit: a fourth connection is served, a fifth is
	// closed right after accept.
	fourth := nbdDial(t, v.nbd)
	c, err := net.DialTimeout("tcp", v.nbd, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.ReadFull(c, make([]byte, 18)); err == nil || n != 0 {
		t.Errorf("connection past max_connections: read %d bytes of the greeting, err %v; want it closed", n, err)
	}
	c.Close()
	// The session limit: a sixth session logs in, a seventh gets 0x0302.
	sixth := ffp(t, v.addr)
	loginRefused(t, v.addr, pdu.LoginOutOfResources)
	m = scrape(t, v.metrics)
	if m[`vmsan_frontend_connections_refused_total{frontend="nbd"}`] < 1 || m[`vmsan_frontend_connections_refused_total{frontend="iscsi"}`] < 1 {
		t.Errorf("refused connection metrics: nbd %.0f, iscsi %.0f; want >= 1 each",
			m[`vmsan_frontend_connections_refused_total{frontend="nbd"}`], m[`vmsan_frontend_connections_refused_total{frontend="iscsi"}`])
	}

	// The hogs leave: everything is given back, real clients work.
	for _, c := range append(nbdHogs, paused, fourth) {
		c.Close()
	}
	for _, r := range append(sessions, sixth) {
		r.c.Close()
	}
	waitFor(t, "the budget to be given back", func() bool { return used() == 0 })
	cred := rawUser + "%" + rawSecret
	for _, url := range []string{v.url(cred, 0), "nbd://" + v.nbd + "/disk"} {
		out, err := run(t, 60*time.Second, "qemu-io", "-f", "raw", url,
			"-c", "write -P 0x5c 1M 8M", "-c", "aio_write -P 0x3d 16M 32M", "-c", "aio_flush",
			"-c", "read -P 0x5c 1M 8M", "-c", "read -P 0x3d 16M 32M")
		if err != nil || strings.Contains(out, "fail") || strings.Contains(out, "error") {
			t.Errorf("qemu-io %s after the hogs: %v\n%s", url, err, out)
		}
	}
	if u := used(); u != 0 {
		t.Errorf("budget used %.0f after the clients finished", u)
	}
}

// iscsiHog sends n WRITEs of hogWrite bytes on r and answers every R2T
// but each command's last, so an admitted command holds its whole buffer,
// written but for the last burst. It returns how many commands were
// admitted and how many were answered BUSY and TASK SET FULL.
// REQUIRES: r negotiated InitialR2T=Yes.
func iscsiHog(t *testing.T, r *raw, n int) (admitted, busy, full int) {
	t.Helper()
	for range n {
		r.send(r.cmd(write10(0, hogWrite/512-1), false, true, hogWrite), nil)
	}
	data := make([]byte, 262144)
	for admitted+busy+full < n {
		f, err := r.recv(20 * time.Second)
		if err != nil {
			t.Fatalf("hog session: %v", err)
		}
		switch h := f.Header.(type) {
		case *pdu.R2T:
			if h.BufferOffset+h.DesiredDataTransferLength == hogWrite {
				admitted++
				continue
			}
			if int(h.DesiredDataTransferLength) > len(data) {
				t.Fatalf("R2T for %d bytes, more than MaxRecvDataSegmentLength", h.DesiredDataTransferLength)
			}
			r.send(&pdu.DataOut{Final: true, ITT: h.ITT, TTT: h.TTT, BufferOffset: h.BufferOffset}, data[:h.DesiredDataTransferLength])
		case *pdu.SCSIResponse:
			switch h.Status {
			case pdu.StatusBusy:
				busy++
			case pdu.StatusTaskSetFull:
				full++
			default:
				t.Fatalf("hog WRITE answered %v", h.Status)
			}
		default:
			t.Fatalf("hog session got %T", f.Header)
		}
	}
	return admitted, busy, full
}

// loginRefused logs in with CHAP and requires the final login response's
// status to be want.
func loginRefused(t *testing.T, addr string, want pdu.LoginStatus) {
	t.Helper()
	r := rawDial(t, addr)
	ans, err := chap.Answer(r.chapStart(), rawUser, []byte(rawSecret), nil)
	if err != nil {
		t.Fatal(err)
	}
	var pairs []string
	for _, p := range ans {
		pairs = append(pairs, p.Key, p.Value)
	}
	rsp, _ := r.loginPDU(&pdu.LoginRequest{CSG: pdu.StageSecurityNegotiation, Transit: true, NSG: pdu.StageLoginOperationalNegotiation}, kv(pairs...))
	if rsp.Status != pdu.LoginSuccess {
		t.Fatalf("CHAP_R: status %v", rsp.Status)
	}
	rsp, _ = r.loginPDU(&pdu.LoginRequest{CSG: pdu.StageLoginOperationalNegotiation, Transit: true, NSG: pdu.StageFullFeaturePhase}, nil)
	if rsp.Status != want {
		t.Fatalf("login past max_sessions: status %v, want %v", rsp.Status, want)
	}
	r.expectClosed()
}

// nbdDial connects and negotiates export "disk" with NBD_OPT_EXPORT_NAME
// (fixed newstyle, no zeroes).
func nbdDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	greet := make([]byte, 18)
	if _, err := io.ReadFull(c, greet); err != nil {
		t.Fatalf("NBD greeting: %v", err)
	}
	b := proto.AppendClientFlags(nil, uint32(proto.FlagFixedNewstyle|proto.FlagNoZeroes))
	b = proto.AppendOption(b, proto.OptExportName, []byte("disk"))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	info := make([]byte, 10) // size, transmission flags
	if _, err := io.ReadFull(c, info); err != nil {
		t.Fatalf("NBD_OPT_EXPORT_NAME: %v", err)
	}
	if binary.BigEndian.Uint64(info) != volSize {
		t.Fatalf("export size %d", binary.BigEndian.Uint64(info))
	}
	c.SetDeadline(time.Time{})
	return c
}

// nbdSendWrite sends a WRITE header for length bytes and send bytes of
// its payload.
func nbdSendWrite(t *testing.T, c net.Conn, length, send int) {
	t.Helper()
	b := proto.AppendRequest(nil, proto.Request{Type: proto.CmdWrite, Cookie: 1, Length: uint32(length)})
	b = append(b, make([]byte, send)...)
	c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(b); err != nil {
		t.Fatalf("NBD write request: %v", err)
	}
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
