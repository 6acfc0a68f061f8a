// Package iscsi tests vmsan's iSCSI target with real initiators we did not
// write: libiscsi's iscsi-ls, iscsi-inq, iscsi-readcapacity16 and its
// conformance suite iscsi-test-cu, and QEMU's libiscsi block driver
// (qemu-img, qemu-io over iscsi://). Each test starts its own
// `vmsan serve --iscsi-listen` on a free loopback port with its own data
// directory. TestLibiscsiSuiteVsTgt also runs tgtd (Linux's user-space
// SCSI target) on the same file and compares the suite's results.
//
// A missing tool fails in CI and skips locally (testutil.NeedTool).
package iscsi

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

var vmsanBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := testutil.BuildVmsan()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	vmsanBin = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// nodeIQN is the target name the tests configure (node_name "test").
const nodeIQN = "iqn.2026-11.org.vmsan:test"

// volSize is the test volume's size: small enough that whole-LUN tests
// of the libiscsi suite stay quick.
const volSize = 64 << 20

type vmsan struct {
	addr string // iSCSI portal
	dir  string
	raw  string // the volume's raw file
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// startVmsan serves one 64 MiB volume "disk" over iSCSI with the given
// extra YAML under `iscsi:` (indented by four spaces).
func startVmsan(t *testing.T, iscsiYAML string) *vmsan {
	t.Helper()
	return startVmsanIn(t, testutil.DiskTempDir(t), "", iscsiYAML)
}

// startVmsanIn is startVmsan with a given directory (a restart reuses it)
// and extra volume entries (YAML list items, indented by two spaces).
func startVmsanIn(t *testing.T, dir, volumesYAML, iscsiYAML string) *vmsan {
	t.Helper()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nbdPort, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg := fmt.Sprintf(`data_dir: %s
listen: ["127.0.0.1:%d"]
no_default_volume: true
volumes:
  - {name: disk, size: %d}
%siscsi:
    listen: ["%s"]
    node_name: test
    nop_interval: 2s
%s`, filepath.Join(dir, "data"), nbdPort, volSize, volumesYAML, addr, iscsiYAML)
	cf := filepath.Join(dir, "vmsan.yaml")
	if err := os.WriteFile(cf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "vmsan.log"))
	if err != nil {
		t.Fatal(err)
	}
	v := &vmsan{addr: addr, dir: dir, raw: filepath.Join(dir, "data", "volumes", "disk.raw"), log: logf, done: make(chan struct{})}
	v.cmd = exec.Command(vmsanBin, "serve", "--config", cf)
	v.cmd.Stdout, v.cmd.Stderr = logf, logf
	if err := v.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { v.cmd.Wait(); close(v.done) }()
	t.Cleanup(func() { v.stop(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return v
		}
		select {
		case <-v.done:
			t.Fatalf("vmsan serve exited:\n%s", v.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vmsan did not listen on %s:\n%s", addr, v.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (v *vmsan) logTail() string {
	b, _ := os.ReadFile(v.log.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop sends SIGTERM and waits for the graceful drain.
func (v *vmsan) stop(t *testing.T) {
	select {
	case <-v.done:
		return
	default:
	}
	v.cmd.Process.Signal(os.Interrupt)
	select {
	case <-v.done:
	case <-time.After(30 * time.Second):
		v.cmd.Process.Kill()
		<-v.done
		t.Errorf("vmsan did not stop on SIGINT within 30s:\n%s", v.logTail())
	}
	v.log.Close()
}

func (v *vmsan) url(cred string, lun int) string {
	if cred != "" {
		cred += "@"
	}
	return fmt.Sprintf("iscsi://%s%s/%s/%d", cred, v.addr, nodeIQN, lun)
}

func run(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	bin := testutil.NeedTool(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
