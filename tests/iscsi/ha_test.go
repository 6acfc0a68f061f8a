package iscsi

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// Multipath and the replicated pair (docs/iscsi.md "Multipath" and "HA
// pair"): several portals of one node, and two replicated nodes that
// present a volume as one logical unit.

// proc is a vmsan serve started from a whole config file.
type proc struct {
	dir  string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

func freeLoop(t *testing.T) string {
	t.Helper()
	p, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", p)
}

// startProc writes cfg to dir/vmsan.yaml, runs vmsan serve and waits until
// waitAddr accepts connections.
func startProc(t *testing.T, dir, cfg, waitAddr string) *proc {
	t.Helper()
	return startProcNofile(t, dir, cfg, waitAddr, 0)
}

// startProcNofile is startProc with the process's RLIMIT_NOFILE (soft and
// hard) set to nofile through prlimit(1) (0: inherited), so that a test
// can exhaust its file descriptors with a few hundred connections.
func startProcNofile(t *testing.T, dir, cfg, waitAddr string, nofile int) *proc {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cf := filepath.Join(dir, "vmsan.yaml")
	if err := os.WriteFile(cf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "vmsan.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{dir: dir, log: logf, done: make(chan struct{})}
	p.cmd = exec.Command(vmsanBin, "serve", "--config", cf)
	if nofile > 0 {
		pl := testutil.NeedTool(t, "prlimit")
		p.cmd = exec.Command(pl, fmt.Sprintf("--nofile=%d:%d", nofile, nofile), "--", vmsanBin, "serve", "--config", cf)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", waitAddr, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("vmsan serve exited:\n%s", p.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vmsan did not listen on %s:\n%s", waitAddr, p.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop sends SIGINT and waits for the drain, killing after 30 s; it
// reports whether it had to kill. Idempotent.
func (p *proc) stop() (killed bool) {
	select {
	case <-p.done:
		return false
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		killed = true
	}
	p.log.Close()
	return killed
}

func (p *proc) kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// vpd83 returns iscsi-inq's Device Identification page for url.
func vpd83(t *testing.T, url string) string {
	t.Helper()
	out, err := run(t, 30*time.Second, "iscsi-inq", "-e", "1", "-c", "131", url) // 0x83: iscsi-inq reads the page code as decimal
	if err != nil {
		t.Fatalf("iscsi-inq VPD 83 %s: %v\n%s", url, err, out)
	}
	return out
}

// lunIdentity returns the logical unit designators of iscsi-inq's VPD 83
// output (T10 vendor id and NAA; iscsi-inq prints binary designators as
// raw bytes, compared as they are) and how many target port and port group
// designators it lists.
func lunIdentity(t *testing.T, out string) (t10, naa string, portDesigs int) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		next := ""
		if i+1 < len(lines) {
			next = lines[i+1]
		}
		switch {
		case strings.Contains(l, "Designator Type:(1) T10"):
			t10 = next
		case strings.Contains(l, "Designator Type:(3) NAA"):
			naa = next
		case strings.Contains(l, "RELATIVE_TARGET_PORT"), strings.Contains(l, "TARGET_PORT_GROUP"):
			portDesigs++
		}
	}
	if t10 == "" || naa == "" {
		t.Fatalf("VPD 83 without T10 or NAA designator:\n%s", out)
	}
	return
}

// TestMultipathTwoPortals: one node with two portals in two portal groups.
// SendTargets lists both with their tags; both paths report the same NAA
// designator and their own relative port and group; libiscsi's
// MultipathIO suite (two URLs: one session per portal) passes.
func TestMultipathTwoPortals(t *testing.T) {
	bin := testutil.NeedTool(t, "iscsi-test-cu")
	dir := testutil.DiskTempDir(t)
	p1, p2, nbd := freeLoop(t), freeLoop(t), freeLoop(t)
	startProc(t, dir, fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - {name: disk, size: %d}
iscsi:
    listen: [{addr: %q, tpgt: 1}, {addr: %q, tpgt: 2}]
    node_name: test
    allow_any: true
`, filepath.Join(dir, "data"), nbd, volSize, p1, p2), p2)

	out, err := run(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+p1)
	if err != nil || !strings.Contains(out, "Portal:"+p1+",1") || !strings.Contains(out, "Portal:"+p2+",2") {
		t.Fatalf("iscsi-ls does not list both portals with their tags: %v\n%s", err, out)
	}
	url1 := fmt.Sprintf("iscsi://%s/%s/0", p1, nodeIQN)
	url2 := fmt.Sprintf("iscsi://%s/%s/0", p2, nodeIQN)
	v1, v2 := vpd83(t, url1), vpd83(t, url2)
	t1, n1, d1 := lunIdentity(t, v1)
	t2, n2, d2 := lunIdentity(t, v2)
	if t1 != t2 || n1 != n2 || d1 != 2 || d2 != 2 {
		t.Fatalf("the two paths do not identify one logical unit with port designators:\n%s\n---\n%s", v1, v2)
	}

	cmd := exec.Command(bin, "--dataloss", "--verbose", "--test=ALL.MultipathIO", url1, url2)
	cmd.Dir = t.TempDir()
	done := make(chan struct{})
	var cuOut []byte
	go func() { cuOut, _ = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("iscsi-test-cu MultipathIO timed out:\n%s", cuOut)
	}
	res := parseCU(string(cuOut))
	passed, failed := 0, 0
	for name, r := range res {
		t.Logf("%s: %s", name, r)
		switch r {
		case cuPass:
			passed++
		case cuFail:
			failed++
		}
	}
	if passed < 4 || failed > 0 {
		t.Fatalf("MultipathIO: %d tests passed (want 4, no failure):\n%s", passed, cuOut)
	}
}

// pairNode is one node of a replicated pair serving volume "disk" over
// iSCSI (per-volume mode) and replicating it to the other.
type pairNode struct {
	dir, data, iscsi, nbd, repl string
	p                           *proc
	cfg                         string
}

const pairSCSIID = "5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11"

func (n *pairNode) url() string { return fmt.Sprintf("iscsi://%s/%s:disk/0", n.iscsi, nodeIQN) }

func (n *pairNode) start(t *testing.T) { n.p = startProc(t, n.dir, n.cfg, n.iscsi) }

// replStatus is the node's replication status of "disk".
func (n *pairNode) replStatus(t *testing.T) (role, conn string) {
	t.Helper()
	c, err := daemon.Dial(n.data)
	if err != nil {
		return "", ""
	}
	defer c.Close()
	var sts []struct {
		Volume string `json:"volume"`
		Role   string `json:"role"`
		Conn   string `json:"connection"`
	}
	if err := c.Do("GET", "/v1/repl", nil, &sts); err != nil || len(sts) == 0 {
		return "", ""
	}
	return sts[0].Role, sts[0].Conn
}

func waitCond(t *testing.T, what string, d time.Duration, cond func() bool, more ...func() string) {
	extra := func() string {
		if len(more) > 0 {
			return ":\n" + more[0]()
		}
		return ""
	}
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s%s", what, extra())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startISCSIPair starts two replicated nodes (protocol C, per-volume
// iSCSI with the same scsi_id, each the other's peer portal group), a
// primary and b secondary, and waits until they are connected.
func startISCSIPair(t *testing.T) (a, b *pairNode) {
	t.Helper()
	base := testutil.DiskTempDir(t)
	a = &pairNode{dir: filepath.Join(base, "a"), iscsi: freeLoop(t), nbd: freeLoop(t), repl: freeLoop(t)}
	b = &pairNode{dir: filepath.Join(base, "b"), iscsi: freeLoop(t), nbd: freeLoop(t), repl: freeLoop(t)}
	conf := func(n, peer *pairNode, role string, tpgt, peerTPGT int) string {
		n.data = filepath.Join(n.dir, "data")
		return fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - name: disk
    size: %d
    replication:
      listen: %s
      peer: %s
      role: %s
      protocol: C
      ping_interval: 100ms
      ping_timeout: 1s
      shared_secret: "test-pair-shared-secret-0123"
iscsi:
    mode: per-volume
    node_name: test
    allow_any: true
    listen: [{addr: %q, tpgt: %d, relative_port: %d}]
    peer_portals: [{addr: %q, tpgt: %d, relative_port: %d}]
    targets: [{volume: disk, scsi_id: %s}]
`, n.data, n.nbd, volSize, n.repl, peer.repl, role, n.iscsi, tpgt, tpgt, peer.iscsi, peerTPGT, peerTPGT, pairSCSIID)
	}
	a.cfg = conf(a, b, "primary", 1, 2)
	b.cfg = conf(b, a, "secondary", 2, 1)
	a.start(t)
	b.start(t)
	waitCond(t, "replication connected", 60*time.Second, func() bool {
		ra, ca := a.replStatus(t)
		rb, cb := b.replStatus(t)
		return ra == "Primary" && rb == "Secondary" && ca == "Connected" && cb == "Connected"
	})
	return a, b
}

// TestReplicatedPairISCSI: two replicated nodes (protocol C) present the
// volume as one logical unit: the same designators on both (scsi_id), the
// primary serves I/O, the secondary's path is standby (I/O refused with
// NOT READY, which QEMU reports as an error). After kill -9 of the
// primary and `vmsan repl promote` on the secondary, the secondary's path
// serves the data written before the kill. The time from the kill to the
// first read completed on the promoted node is logged (the target side of
// a node failover; the initiator's path checker adds its interval). The
// old primary then restarts as secondary with a standby path.
func TestReplicatedPairISCSI(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	a, b := startISCSIPair(t)

	qio := func(url string, cmds ...string) (string, error) {
		args := []string{"-f", "raw"}
		for _, c := range cmds {
			args = append(args, "-c", c)
		}
		return run(t, 60*time.Second, "qemu-io", append(args, url)...)
	}
	va := vpd83(t, a.url())
	if out, err := qio(a.url(), "write -P 0xa5 0 1M", "flush"); err != nil || strings.Contains(out, "error") {
		t.Fatalf("write through the primary: %v\n%s", err, out)
	}
	// The secondary's path is standby: libiscsi's connect ends with TEST
	// UNIT READY, which standby answers NOT READY, 04/0B (SPC-4: TEST
	// UNIT READY is not among the commands a standby port serves; Linux's
	// tur path checker reads that as a standby path).
	if out, err := run(t, 30*time.Second, "iscsi-inq", b.url()); err == nil || !strings.Contains(out, "0x040b") {
		t.Fatalf("the secondary's path is not standby (want NOT READY 04/0B): %v\n%s", err, out)
	}

	killed := time.Now()
	a.p.kill9()
	waitCond(t, "secondary notices the primary is gone", 30*time.Second, func() bool {
		_, c := b.replStatus(t)
		return c != "Connected" && c != ""
	})
	if out, err := run(t, 60*time.Second, vmsanBin, "repl", "promote", "disk", "--data-dir", b.data); err != nil {
		t.Fatalf("promote: %v\n%s", err, out)
	}
	promoted := time.Now()
	var out string
	var err error
	waitCond(t, "a read through the promoted node", 60*time.Second, func() bool {
		out, err = qio(b.url(), "read -P 0xa5 0 1M")
		return err == nil && !strings.Contains(out, "error") && !strings.Contains(out, "fail")
	}, func() string {
		r, c := b.replStatus(t)
		return fmt.Sprintf("%v %s\nrole %s conn %s\n%s", err, out, r, c, b.p.logTail())
	})
	done := time.Now()
	// The promote went through ALUA transitioning to active/optimized
	// (the role controller -> the daemon's front-end roles -> the iSCSI
	// front end).
	log := b.p.logTail()
	ch, pr := strings.Index(log, "role=changing was=secondary"), strings.Index(log, "role=primary was=changing")
	if ch < 0 || pr < ch {
		t.Fatalf("the promote's role steps (secondary -> changing -> primary) are not in the log:\n%s", log)
	}
	// One logical unit: the same designators through both nodes (the
	// secondary's are read now that it serves).
	vb := vpd83(t, b.url())
	ta, na, da := lunIdentity(t, va)
	tb, nb, db := lunIdentity(t, vb)
	if ta != tb || na != nb || da != 2 || db != 2 || !strings.Contains(ta, "5f0c2d9e0b7e4c559a412b1f0e9f6c11") {
		t.Fatalf("the two nodes do not present one logical unit:\n%s\n---\n%s", va, vb)
	}
	t.Logf("node failover (target side): kill -9 -> promote %.2fs, promote -> first good read %.2fs, total %.2fs",
		promoted.Sub(killed).Seconds(), done.Sub(promoted).Seconds(), done.Sub(killed).Seconds())

	// The old primary restarts: crashed while primary, it comes back
	// secondary, resyncs, and its path is standby.
	if out, err := qio(b.url(), "write -P 0x5a 1M 64k", "flush"); err != nil || strings.Contains(out, "error") {
		t.Fatalf("write through the promoted node: %v\n%s", err, out)
	}
	a.start(t)
	waitCond(t, "old primary back as secondary, connected", 60*time.Second, func() bool {
		ra, ca := a.replStatus(t)
		rb, cb := b.replStatus(t)
		return ra == "Secondary" && rb == "Primary" && ca == "Connected" && cb == "Connected"
	})
	if out, err := run(t, 30*time.Second, "iscsi-inq", a.url()); err == nil || !strings.Contains(out, "0x040b") {
		t.Fatalf("the restarted old primary's path is not standby: %v\n%s", err, out)
	}

	// Planned switch-over back to a, without --force: b's logical unit
	// still holds the volume between sessions, but it follows roles (its
	// admitted commands are drained before the demote), so it does not
	// count as a client holding the volume open.
	if out, err := qio(b.url(), "write -P 0x3c 2M 64k", "flush"); err != nil || strings.Contains(out, "error") {
		t.Fatalf("write through b before the switch-over: %v\n%s", err, out)
	}
	if out, err := run(t, 60*time.Second, vmsanBin, "repl", "demote", "disk", "--data-dir", b.data); err != nil {
		t.Fatalf("planned demote without --force while only the iSCSI logical unit holds the volume: %v\n%s", err, out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", b.url()); err == nil || !strings.Contains(out, "0x040b") {
		t.Fatalf("the demoted node's path is not standby: %v\n%s", err, out)
	}
	if out, err := run(t, 60*time.Second, vmsanBin, "repl", "promote", "disk", "--data-dir", a.data); err != nil {
		t.Fatalf("promote after the planned demote: %v\n%s", err, out)
	}
	waitCond(t, "data written before the switch-over reads back through the new primary", 60*time.Second, func() bool {
		out, err = qio(a.url(), "read -P 0x3c 2M 64k", "read -P 0x5a 1M 64k", "read -P 0xa5 0 1M")
		return err == nil && !strings.Contains(out, "error") && !strings.Contains(out, "fail")
	}, func() string { return fmt.Sprintf("%v %s\n%s", err, out, a.p.logTail()) })

	// An NBD client is not role-following: while one holds the volume,
	// demote without --force is still refused. It writes first, and the
	// write read back over iSCSI proves it is connected.
	qemuIO := testutil.NeedTool(t, "qemu-io")
	ctx, cancel := context.WithCancel(context.Background())
	holder := exec.CommandContext(ctx, qemuIO, "-f", "raw", "-c", "write -P 0x77 3M 4k", "-c", "sleep 30000", "nbd://"+a.nbd+"/disk")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); holder.Wait() }()
	waitCond(t, "the NBD client's write", 30*time.Second, func() bool {
		out, err = qio(a.url(), "read -P 0x77 3M 4k")
		return err == nil && !strings.Contains(out, "error") && !strings.Contains(out, "fail")
	})
	if out, err := run(t, 60*time.Second, vmsanBin, "repl", "demote", "disk", "--data-dir", a.data); err == nil || !strings.Contains(out, "held open") {
		t.Fatalf("demote while an NBD client holds the volume: %v, want refused (held open)\n%s", err, out)
	}
	if r, _ := a.replStatus(t); r != "Primary" {
		t.Fatalf("role %q after a refused demote, want Primary", r)
	}
}
