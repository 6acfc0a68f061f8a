package iscsi

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
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
    nop_interval: 2s
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
