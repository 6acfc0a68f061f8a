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
	*proc          // the process, its log and data directory
	addr    string // iSCSI portal
	nbd     string // NBD listener, host:port
	raw     string // the volume's raw file
	metrics string // Prometheus endpoint, host:port
}

// startVmsan serves one 64 MiB volume "disk" over iSCSI with the given
// extra YAML under `iscsi:` (indented by four spaces). Unless that YAML
// sets allow_any itself, it gets `allow_any: true`: most tests log in
// without CHAP or an ACL, which the daemon refuses by default.
func startVmsan(t *testing.T, iscsiYAML string) *vmsan {
	t.Helper()
	return startVmsanIn(t, testutil.DiskTempDir(t), "", iscsiYAML)
}

// startVmsanIn is startVmsan with a given directory (a restart reuses it)
// and extra volume entries (YAML list items, indented by two spaces).
func startVmsanIn(t *testing.T, dir, volumesYAML, iscsiYAML string) *vmsan {
	t.Helper()
	return startVmsanNofile(t, dir, volumesYAML, iscsiYAML, 0)
}

// startVmsanNofile is startVmsanIn with RLIMIT_NOFILE set to nofile
// (startProcNofile; 0: inherited).
func startVmsanNofile(t *testing.T, dir, volumesYAML, iscsiYAML string, nofile int) *vmsan {
	t.Helper()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nbdPort, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsPort, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	metrics := fmt.Sprintf("127.0.0.1:%d", metricsPort)
	if !strings.Contains(iscsiYAML, "allow_any:") {
		iscsiYAML = "    allow_any: true\n" + iscsiYAML
	}
	cfg := fmt.Sprintf(`data_dir: %s
listen: ["127.0.0.1:%d"]
metrics_listen: %s
no_default_volume: true
volumes:
  - {name: disk, size: %d}
%siscsi:
    listen: ["%s"]
    node_name: test
%s`, filepath.Join(dir, "data"), nbdPort, metrics, volSize, volumesYAML, addr, iscsiYAML)
	v := &vmsan{proc: startProcNofile(t, dir, cfg, addr, nofile), addr: addr, nbd: fmt.Sprintf("127.0.0.1:%d", nbdPort), raw: filepath.Join(dir, "data", "volumes", "disk.raw"), metrics: metrics}
	// Registered after startProc's cleanup, so it runs first and reports
	// a daemon that does not drain.
	t.Cleanup(func() { v.stop(t) })
	return v
}

// stop sends SIGINT and waits for the graceful drain; a daemon that needs
// SIGKILL after 30 s is an error.
func (v *vmsan) stop(t *testing.T) {
	if v.proc.stop() {
		t.Errorf("vmsan did not stop on SIGINT within 30s:\n%s", v.logTail())
	}
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
