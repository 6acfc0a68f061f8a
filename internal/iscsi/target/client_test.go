package target

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/testutil"
)

const testIQN = "iqn.2026-11.org.vmsan:test"

type testServer struct {
	srv  *Server
	addr string
	lu   *ramLU
}

// waitAborted waits until a task management function has marked the task
// itt of some session aborted (it then waits for the task to end): the
// point a test must reach before it lets the task complete.
func (ts *testServer) waitAborted(t *testing.T, itt uint32) {
	t.Helper()
	aborted := func() bool {
		ts.srv.mu.Lock()
		var ss []*session
		for _, s := range ts.srv.byTSIH {
			ss = append(ss, s)
		}
		ts.srv.mu.Unlock()
		for _, s := range ss {
			s.mu.Lock()
			tk := s.tasks[itt]
			a := tk != nil && tk.aborted
			s.mu.Unlock()
			if a {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !aborted(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("task %d was not marked aborted", itt)
		}
	}
}

// startServer serves one target with a RAM LU on a loopback port.
func startServer(t *testing.T, mod func(*Config, *Target)) *testServer {
	t.Helper()
	lu := newRAMLU(8 << 20)
	tg := Target{Name: testIQN, LUs: lu, Volumes: []string{"ram"}, AllowAny: true}
	cfg := Config{}
	if mod != nil {
		mod(&cfg, &tg)
	}
	cfg.Targets = func() []Target { return []Target{tg} }
	srv := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln, 1)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &testServer{srv: srv, addr: ln.Addr().String(), lu: lu}
}

func runTool(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	bin := testutil.NeedTool(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

func TestISCSILsDiscovery(t *testing.T) {
	ts := startServer(t, nil)
	out, err := runTool(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+ts.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	want := fmt.Sprintf("Target:%s Portal:%s,1", testIQN, ts.addr)
	if !strings.Contains(out, want) || !strings.Contains(out, "Lun:0") || !strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("iscsi-ls output lacks %q or LUN 0:\n%s", want, out)
	}
}

func TestISCSILsCHAP(t *testing.T) {
	ts := startServer(t, func(c *Config, tg *Target) {
		c.DiscoveryAuth = &CHAP{User: "disc", Secret: []byte("discsecret1234")}
		tg.Auth = &CHAP{User: "user", Secret: []byte("usersecret1234")}
	})
	url := func(u, p string) string { return fmt.Sprintf("iscsi://%s%%%s@%s", u, p, ts.addr) }
	// Discovery needs the discovery credentials.
	if out, err := runTool(t, 30*time.Second, "iscsi-ls", url("disc", "discsecret1234")); err != nil || !strings.Contains(out, testIQN) {
		t.Fatalf("iscsi-ls with the right discovery secret: %v\n%s", err, out)
	}
	if out, err := runTool(t, 30*time.Second, "iscsi-ls", url("disc", "wrongsecret123")); err == nil || strings.Contains(out, testIQN) {
		t.Fatalf("iscsi-ls with a wrong secret succeeded:\n%s", out)
	}
	if out, err := runTool(t, 30*time.Second, "iscsi-ls", "iscsi://"+ts.addr); err == nil || strings.Contains(out, testIQN) {
		t.Fatalf("iscsi-ls without CHAP succeeded:\n%s", out)
	}
	// The target's own credentials for a normal session.
	lun := fmt.Sprintf("iscsi://user%%usersecret1234@%s/%s/0", ts.addr, testIQN)
	if out, err := runTool(t, 30*time.Second, "iscsi-inq", lun); err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("iscsi-inq with CHAP: %v\n%s", err, out)
	}
	bad := fmt.Sprintf("iscsi://user%%badsecret12345@%s/%s/0", ts.addr, testIQN)
	if out, err := runTool(t, 30*time.Second, "iscsi-inq", bad); err == nil {
		t.Fatalf("iscsi-inq with a wrong secret succeeded:\n%s", out)
	}
	if st := ts.srv.Stats(); st.LoginStatuses[pdu.LoginAuthenticationFailure.String()] == 0 {
		t.Fatalf("no 0201 login status counted: %+v", st.LoginStatuses)
	}
}

func TestISCSIInq(t *testing.T) {
	ts := startServer(t, nil)
	out, err := runTool(t, 30*time.Second, "iscsi-inq", fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN))
	if err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("iscsi-inq: %v\n%s", err, out)
	}
	out, err = runTool(t, 30*time.Second, "iscsi-readcapacity16", fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN))
	if err != nil || !strings.Contains(out, "16383") {
		t.Fatalf("iscsi-readcapacity16: %v\n%s", err, out)
	}
}

// TestQEMUOverISCSI: QEMU's libiscsi driver writes a pattern with
// qemu-io, converts the LUN to a file with qemu-img and compares.
func TestQEMUOverISCSI(t *testing.T) {
	for _, dig := range []string{"none", "crc32c"} {
		t.Run(dig, func(t *testing.T) {
			ts := startServer(t, nil)
			url := fmt.Sprintf("iscsi://%s/%s/0", ts.addr, testIQN)
			opts := fmt.Sprintf("driver=iscsi,transport=tcp,portal=%s,target=%s,lun=0,header-digest=%s",
				ts.addr, testIQN, dig)
			if out, err := runTool(t, 60*time.Second, "qemu-img", "info", url); err != nil || !strings.Contains(out, "8 MiB") {
				t.Fatalf("qemu-img info: %v\n%s", err, out)
			}
			// Writes larger than FirstBurstLength and MaxBurstLength go
			// through immediate data, unsolicited Data-Out and R2Ts.
			if out, err := runTool(t, 60*time.Second, "qemu-io", "--image-opts", opts,
				"-c", "write -P 0xa5 0 3M", "-c", "write -P 0x5a 3M 4k", "-c", "aio_write -P 0x11 4M 64k",
				"-c", "aio_write -P 0x22 5M 1M", "-c", "aio_flush",
				"-c", "read -P 0xa5 0 3M", "-c", "read -P 0x5a 3M 4k", "-c", "read -P 0x22 5M 1M",
				"-c", "read -P 0x11 4M 64k"); err != nil || strings.Contains(out, "fail") || strings.Contains(out, "error") {
				t.Fatalf("qemu-io: %v\n%s", err, out)
			}
			dir := t.TempDir()
			raw := filepath.Join(dir, "copy.raw")
			if out, err := runTool(t, 60*time.Second, "qemu-img", "convert", "-O", "raw", url, raw); err != nil {
				t.Fatalf("qemu-img convert: %v\n%s", err, out)
			}
			if out, err := runTool(t, 60*time.Second, "qemu-img", "compare", "-f", "raw", "-F", "raw", raw, url); err != nil {
				t.Fatalf("qemu-img compare: %v\n%s", err, out)
			}
			b, err := os.ReadFile(raw)
			if err != nil || len(b) != 8<<20 || b[0] != 0xa5 || b[3<<20] != 0x5a || b[5<<20] != 0x22 {
				t.Fatalf("copy content wrong (err %v)", err)
			}
		})
	}
}
