package iscsiguest_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// target is an iSCSI target on the host as the guest needs to know it.
type target struct {
	Kind   string // "tgt", "vmsan" or "external"
	Portal string // host:port on this host's loopback
	// Portal2 is a second portal of the same target for multipath (vmsan:
	// its own portal group); Portal again where the target has one.
	Portal2 string
	IQN     string
	User    string // CHAP (one-way) account
	Secret  string
	// MutualUser/MutualSecret: the target's answer when the initiator
	// asks for mutual CHAP on a normal session ("": none).
	MutualUser, MutualSecret string
	// DiscUser/DiscSecret: the CHAP account discovery sessions need, ""
	// where discovery is open (tgt 1.0.85 has no discovery CHAP: its
	// accounts bind to targets, and tid 0 is none); DiscMutualUser/
	// DiscMutualSecret: the target's answer for mutual CHAP, if any.
	DiscUser, DiscSecret             string
	DiscMutualUser, DiscMutualSecret string
	Vendor                           string // what INQUIRY answers: the multipath.conf device section matches it
	Product                          string
	Backing                          string // the file behind the LU, "" if unknown (external)
	ALUA                             bool   // implicit ALUA, all ports active/optimized (tgt: no)
	Size                             int64
	// Stop, if set, stops the target gracefully (idempotent) so that the
	// backing file is complete before the host reads it.
	Stop func()
	// Restart, if set, stops the target (gracefully, or with SIGKILL when
	// kill is true) and starts it again on the same data and portals.
	Restart func(kill bool) error
}

// targetKinds are the targets the guest tests run against, each as a
// subtest: VMSAN_ISCSI_TARGET names one; by default tgt (the reference)
// and vmsan's own target.
func targetKinds() []string {
	if k := os.Getenv("VMSAN_ISCSI_TARGET"); k != "" {
		return []string{k}
	}
	return []string{"tgt", "vmsan"}
}

// guestPortal is the portal as the guest reaches it: QEMU's user network
// puts the host's 127.0.0.1 at 10.0.2.2.
func guestPortal(hostAddr string) string {
	_, port, err := net.SplitHostPort(hostAddr)
	if err != nil {
		return hostAddr
	}
	return "10.0.2.2:" + port
}

// startTarget starts (or names) the target under test; see the package
// documentation for VMSAN_ISCSI_TARGET.
func startTarget(t *testing.T, kind string, size int64) *target {
	t.Helper()
	switch kind {
	case "tgt":
		return startTgt(t, size)
	case "vmsan":
		return startVmsan(t, size)
	case "external":
		tg := &target{
			Kind:    "external",
			Portal:  os.Getenv("VMSAN_ISCSI_PORTAL"),
			IQN:     os.Getenv("VMSAN_ISCSI_IQN"),
			User:    os.Getenv("VMSAN_ISCSI_USER"),
			Secret:  os.Getenv("VMSAN_ISCSI_SECRET"),
			Vendor:  envOr("VMSAN_ISCSI_VENDOR", "VMSAN"),
			Product: envOr("VMSAN_ISCSI_PRODUCT", "vmsan"),
			Backing: os.Getenv("VMSAN_ISCSI_BACKING"),
			ALUA:    os.Getenv("VMSAN_ISCSI_ALUA") == "1",
		}
		tg.Portal2 = envOr("VMSAN_ISCSI_PORTAL2", tg.Portal)
		if tg.Portal == "" || tg.IQN == "" || tg.User == "" || tg.Secret == "" {
			t.Fatal("VMSAN_ISCSI_TARGET=external needs VMSAN_ISCSI_PORTAL, VMSAN_ISCSI_IQN, VMSAN_ISCSI_USER and VMSAN_ISCSI_SECRET")
		}
		if tg.Backing != "" {
			if fi, err := os.Stat(tg.Backing); err == nil {
				tg.Size = fi.Size()
			}
		}
		return tg
	default:
		t.Fatalf("VMSAN_ISCSI_TARGET=%q: want tgt, vmsan or external", kind)
		return nil
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Ports for tgtd come from 27000-27999 (tests/repl uses 25000-25999), below
// the kernel's ephemeral range so that a port found free is not taken by
// an outgoing connection before tgtd binds it. tgtd's control channel is a
// unix socket named after its control port; the same number is used.
const portLo, portHi = 27000, 28000

var (
	portMu   sync.Mutex
	nextPort = portLo + os.Getpid()%(portHi-portLo)
)

func pickPort() int {
	portMu.Lock()
	defer portMu.Unlock()
	for range portHi - portLo {
		port := nextPort
		nextPort++
		if nextPort >= portHi {
			nextPort = portLo
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		// Another tgtd may own the control socket of that number.
		if _, err := os.Stat(fmt.Sprintf("/var/run/tgtd/socket.%d.lock", port)); err == nil {
			continue
		}
		return port
	}
	return 0
}

// startTgt runs tgtd in the foreground on a sparse file of size bytes: one
// target, LU 1 a disk answering vendor VMSAN / product vmsan (so the guest
// uses the multipath.conf section written for vmsan), thin provisioning on
// (UNMAP punches holes in the file), a CHAP account with an outgoing
// (mutual) one, every initiator address allowed. tgtd also has LU 0, its
// controller. It is killed in Cleanup; target.Restart kills it and starts
// a new one on the same port and file.
func startTgt(t *testing.T, size int64) *target {
	t.Helper()
	testutil.NeedTool(t, "tgtd")
	testutil.NeedTool(t, "tgtadm")
	testutil.NeedRoot(t, "tgtd")
	dir := testutil.DiskTempDir(t)
	backing := filepath.Join(dir, "lun1.img")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tg := &target{
		Kind: "tgt", IQN: "iqn.2026-11.org.vmsan.test:tgt", User: "guest", Secret: "vmsan-chap-secret",
		Vendor: "VMSAN", Product: "vmsan", Backing: backing, Size: size,
		MutualUser: "tgt-answer", MutualSecret: "tgt-mutual-secret",
	}
	// tgtd binds its portal after it started; when the bind fails it
	// logs it and listens on the default portal instead, so a lost race
	// for the port shows only in its log: retry with another port.
	for attempt := 0; ; attempt++ {
		port := pickPort()
		if port == 0 {
			t.Fatal("no free port in 27000-27999 for tgtd")
		}
		ctl, stop, ok := runTgtd(t, port, dir)
		if !ok {
			if attempt == 4 {
				t.Fatal("tgtd could not bind a portal in 5 attempts")
			}
			continue
		}
		tg.Portal = fmt.Sprintf("127.0.0.1:%d", port)
		tg.Portal2 = tg.Portal
		if err := setupTgt(tg, ctl, backing); err != nil {
			t.Fatal(err)
		}
		// tgtd keeps no state but the backing file (written with
		// O_DIRECT): a restart is a kill, a new tgtd on the same port
		// and the same configuration, whether kill is asked or not.
		tg.Restart = func(bool) error {
			stop()
			ctl, nstop, ok := runTgtd(t, port, dir)
			if !ok {
				return fmt.Errorf("tgtd did not start again on port %d", port)
			}
			stop = nstop
			return setupTgt(tg, ctl, backing)
		}
		return tg
	}
}

// setupTgt configures the target of startTgt in the tgtd on control port
// ctl.
func setupTgt(tg *target, ctl, backing string) error {
	adm := func(args ...string) error {
		out, err := exec.Command("tgtadm", append([]string{"-C", ctl, "--lld", "iscsi"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("tgtadm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, args := range [][]string{
		{"--mode", "target", "--op", "new", "--tid", "1", "--targetname", tg.IQN},
		{"--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--backing-store", backing, "--bsoflags", "direct"},
		{"--mode", "logicalunit", "--op", "update", "--tid", "1", "--lun", "1",
			"--params", "vendor_id=" + tg.Vendor + ",product_id=" + tg.Product + ",thin_provisioning=1"},
		{"--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL"},
		{"--mode", "account", "--op", "new", "--user", tg.User, "--password", tg.Secret},
		{"--mode", "account", "--op", "bind", "--tid", "1", "--user", tg.User},
		// The outgoing account answers an initiator that asks for mutual
		// CHAP; logins without it are unaffected.
		{"--mode", "account", "--op", "new", "--user", tg.MutualUser, "--password", tg.MutualSecret},
		{"--mode", "account", "--op", "bind", "--tid", "1", "--user", tg.MutualUser, "--outgoing"},
	} {
		if err := adm(args...); err != nil {
			return err
		}
	}
	return nil
}

// runTgtd starts tgtd with portal 127.0.0.1:port and control port port,
// and returns the control port, a stop function (SIGKILL, idempotent)
// and whether tgtd serves on that portal. It does not t.Fatal on tgtd's
// failures: a restart runs it from the console reader's goroutine.
func runTgtd(t *testing.T, port int, dir string) (string, func(), bool) {
	t.Helper()
	ctl := strconv.Itoa(port)
	logPath := filepath.Join(dir, fmt.Sprintf("tgtd-%d.log", port))
	for n := 2; ; n++ {
		if _, err := os.Stat(logPath); err != nil {
			break
		}
		logPath = filepath.Join(dir, fmt.Sprintf("tgtd-%d-%d.log", port, n))
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("tgtd", "-f", "-C", ctl, "--iscsi", fmt.Sprintf("portal=127.0.0.1:%d", port))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: nothing of it survives the test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			// tgtd ignores SIGTERM while it has targets: SIGKILL (it
			// keeps nothing but the backing file, which the test owns).
			cmd.Process.Kill()
			<-exited
			os.Remove("/var/run/tgtd/socket." + ctl)
			os.Remove("/var/run/tgtd/socket." + ctl + ".lock")
		})
	}
	// Ready when tgtadm answers on the control socket.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if exec.Command("tgtadm", "-C", ctl, "--lld", "iscsi", "--mode", "target", "--op", "show").Run() == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			t.Logf("tgtd on port %d exited: %s", port, log)
			return ctl, nil, false
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			t.Logf("tgtd on port %d did not answer tgtadm in 10 s", port)
			return ctl, nil, false
		}
	}
	// Only the log says whether tgtd got its portal: after a failed bind it
	// still lists the portal (tgtadm --mode portal) but listens on the
	// default one. It binds before it answers tgtadm, so the log is
	// complete by now.
	log, _ := os.ReadFile(logPath)
	if bytes.Contains(log, []byte("failed to create/bind")) || bytes.Contains(log, []byte("another tgtd")) {
		stop()
		t.Logf("tgtd could not use port %d: %s", port, log)
		return ctl, nil, false
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("tgtd log:\n%s", tail(string(log), 40))
		}
	})
	return ctl, stop, true
}
