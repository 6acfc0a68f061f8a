package iscsiguest_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/scsi"
	"github.com/vmsan/vmsan/internal/testutil"
)

// vmsanBin is cmd/vmsan built once per test binary, only when a test runs
// against vmsan (VMSAN_ISCSI_TARGET=tgt needs no Go build); TestMain
// removes it.
var (
	vmsanOnce    sync.Once
	vmsanBin     string
	vmsanErr     error
	vmsanCleanup func()
)

func buildVmsan(t *testing.T) string {
	t.Helper()
	vmsanOnce.Do(func() { vmsanBin, vmsanCleanup, vmsanErr = testutil.BuildVmsan() })
	if vmsanErr != nil {
		t.Fatalf("building vmsan: %v", vmsanErr)
	}
	return vmsanBin
}

// vmsanNode is the node name of the target the tests start: its IQN is
// iqn.2026-11.org.vmsan:NODE, the volume "disk" its LUN 0 (mode node).
const vmsanNode = "guesttest"

// startVmsan runs `vmsan serve` with one volume "disk" of size bytes, two
// iSCSI portals on 127.0.0.1 in portal groups 1 and 2 (the multipath
// test's two paths: the same logical unit, one relative port and one
// implicit-ALUA group each, both active/optimized), the CHAP account of
// startTgt for sessions with a mutual answer (for initiators that ask), a
// CHAP account with a mutual answer for discovery sessions, and a 2 s NOP-In ping. The ports come from
// pickPort's range; a lost race for one (vmsan exits at the failed bind)
// is retried with others. It is stopped (SIGINT, the graceful drain) in
// Cleanup or by target.Stop; target.Restart starts it again on the same
// data directory and ports.
func startVmsan(t *testing.T, size int64) *target {
	t.Helper()
	bin := buildVmsan(t)
	dir := testutil.DiskTempDir(t)
	tg := &target{
		Kind: "vmsan", IQN: "iqn.2026-11.org.vmsan:" + vmsanNode, User: "guest", Secret: "vmsan-chap-secret",
		Vendor: scsi.DefaultVendor, Product: scsi.DefaultProduct, ALUA: true, Size: size,
		Backing:    filepath.Join(dir, "data", "volumes", "disk.raw"),
		MutualUser: "vmsan-answer", MutualSecret: "vmsan-mutual-secret",
		DiscUser: "disc", DiscSecret: "vmsan-disc-secret", DiscMutualUser: "vmsan-disc", DiscMutualSecret: "vmsan-disc-answer",
	}
	for attempt := 0; ; attempt++ {
		nbd, p1, p2 := pickPort(), pickPort(), pickPort()
		if nbd == 0 || p1 == 0 || p2 == 0 {
			t.Fatal("no free ports in 27000-27999 for vmsan")
		}
		tg.Portal, tg.Portal2 = fmt.Sprintf("127.0.0.1:%d", p1), fmt.Sprintf("127.0.0.1:%d", p2)
		cfg := fmt.Sprintf(`data_dir: %s
listen: ["127.0.0.1:%d"]
no_default_volume: true
volumes:
  - {name: disk, size: %d}
iscsi:
    listen: [{addr: %q, tpgt: 1}, {addr: %q, tpgt: 2}]
    node_name: %s
    auth: {user: %s, secret: %q, mutual_user: %s, mutual_secret: %q}
    discovery_auth: {user: %s, secret: %q, mutual_user: %s, mutual_secret: %q}
`, filepath.Join(dir, "data"), nbd, size, tg.Portal, tg.Portal2, vmsanNode, tg.User, tg.Secret, tg.MutualUser, tg.MutualSecret,
			tg.DiscUser, tg.DiscSecret, tg.DiscMutualUser, tg.DiscMutualSecret)
		p, ok := runVmsan(t, bin, dir, cfg, tg.Portal, tg.Portal2)
		if !ok {
			if attempt == 2 {
				t.Fatal("vmsan could not bind its ports in 3 attempts")
			}
			continue
		}
		tg.Stop = p.stop
		tg.Restart = func(kill bool) error {
			if kill {
				p.kill()
			} else {
				p.term()
			}
			// The same ports: a failed bind now is a failure, not a race.
			np, ok := runVmsan(t, bin, dir, cfg, tg.Portal, tg.Portal2)
			if !ok {
				return fmt.Errorf("vmsan did not start again on %s, %s", tg.Portal, tg.Portal2)
			}
			p = np
			tg.Stop = p.stop
			return nil
		}
		return tg
	}
}

// vmsanProc is one running `vmsan serve`.
type vmsanProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{}
	once   sync.Once
}

// stop sends SIGINT (the graceful drain) and waits; idempotent.
func (p *vmsanProc) stop() { p.signal(os.Interrupt) }

// term sends SIGTERM (what a service manager sends) and waits.
func (p *vmsanProc) term() { p.signal(syscall.SIGTERM) }

// kill sends SIGKILL: nothing is flushed, only what reached the data
// directory before survives.
func (p *vmsanProc) kill() { p.signal(os.Kill) }

func (p *vmsanProc) signal(sig os.Signal) {
	p.once.Do(func() {
		p.cmd.Process.Signal(sig)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
			p.t.Errorf("vmsan did not stop on %v within 30 s", sig)
		}
	})
}

// runVmsan writes cfg, starts vmsan serve and waits until both portals
// accept connections. false: vmsan exited before that or did not listen
// within 30 s (its log is in the test log). Each start logs to its own file (vmsan.log, vmsan-2.log, ...).
func runVmsan(t *testing.T, bin, dir, cfg string, portals ...string) (*vmsanProc, bool) {
	t.Helper()
	cf := filepath.Join(dir, "vmsan.yaml")
	if err := os.WriteFile(cf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "vmsan.log")
	for n := 2; ; n++ {
		if _, err := os.Stat(logPath); err != nil {
			break
		}
		logPath = filepath.Join(dir, fmt.Sprintf("vmsan-%d.log", n))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &vmsanProc{t: t, cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); logf.Close(); close(p.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range portals {
		for !dialable(addr) {
			select {
			case <-p.exited:
				log, _ := os.ReadFile(logPath)
				t.Logf("vmsan exited before it listened on %s: %s", addr, tail(string(log), 20))
				return nil, false
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				// No t.Fatal: a restart runs this from the console
				// reader's goroutine.
				p.stop()
				log, _ := os.ReadFile(logPath)
				t.Logf("vmsan did not listen on %s in 30 s:\n%s", addr, tail(string(log), 40))
				return nil, false
			}
		}
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("vmsan log (%s):\n%s", filepath.Base(logPath), tail(string(log), 60))
		}
	})
	return p, true
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// scsiDHALUA reports whether the guest's MAP line says the kernel has
// scsi_dh_alua (the generic kernel; the cloud kernel has no CONFIG_SCSI_DH).
func scsiDHALUA(mapLine string) bool { return strings.Contains(mapLine, " dh_alua=1") }
