package daemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// TestSIGTERMDrain runs the real binary, sends SIGTERM while qemu-io is in
// the middle of a stream of 1 MiB writes, and checks that the daemon exits 0
// and that every write qemu-io saw acknowledged is in the volume file.
func TestSIGTERMDrain(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	bin := buildBinary(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	srv := exec.Command(bin, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--log-level", "info")
	pr, pw, _ := os.Pipe()
	srv.Stdout, srv.Stderr = pw, &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Kill()
		<-exited
	})
	// The banner tells us the port the kernel picked.
	urlRE := regexp.MustCompile(`nbdinfo (nbd://127\.0\.0\.1:\d+/default)`)
	var uri string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
		if m := urlRE.FindStringSubmatch(sc.Text()); m != nil {
			uri = m[1]
			break
		}
	}
	go func() { // keep draining so the daemon never blocks on stdout
		for sc.Scan() {
		}
	}()
	if uri == "" {
		t.Fatalf("no nbdinfo line in banner:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}

	const n = 256
	args := []string{"-f", "raw"}
	for i := 0; i < n; i++ {
		args = append(args, "-c", fmt.Sprintf("write -P %d %d 1M", pattern(i), int64(i)<<20))
	}
	args = append(args, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	qio := exec.CommandContext(ctx, "qemu-io", args...)
	var qout bytes.Buffer
	qio.Stdout, qio.Stderr = &qout, &qout
	if err := qio.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until a few MiB are written, then SIGTERM mid-stream.
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "writes to start", func() bool {
		st, err := c.Status()
		return err == nil && len(st.Volumes) == 1 && st.Volumes[0].Engine != nil && st.Volumes[0].Engine.BytesWritten >= 8<<20
	})
	c.Close()
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
		}
		exited <- nil // for Cleanup
	case <-time.After(45 * time.Second):
		t.Fatalf("daemon did not exit within 45s of SIGTERM\nstderr:\n%s", stderr.String())
	}
	qio.Wait() // qemu-io fails its remaining writes once the server is gone

	ackRE := regexp.MustCompile(`(?m)^wrote 1048576/1048576 bytes at offset (\d+)$`)
	acked := ackRE.FindAllStringSubmatch(qout.String(), -1)
	if len(acked) < 8 {
		t.Fatalf("only %d writes acknowledged before SIGTERM; qemu-io said:\n%s", len(acked), qout.String())
	}
	t.Logf("%d of %d writes acknowledged before shutdown", len(acked), n)
	f, err := os.Open(filepath.Join(dir, "volumes", "default.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for _, m := range acked {
		off, _ := strconv.ParseInt(m[1], 10, 64)
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		want := pattern(int(off >> 20))
		for j, b := range buf {
			if b != want {
				t.Fatalf("acknowledged write at %d lost: byte %d is %#x, want %#x", off, j, b, want)
			}
		}
	}
	if !bytes.Contains(stderr.Bytes(), []byte("shutdown complete")) {
		t.Errorf("no clean-shutdown log line:\n%s", stderr.String())
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	removeBin func()
	buildErr  error
)

// buildBinary builds cmd/vmsan once per test binary run, on first use.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() { builtBin, removeBin, buildErr = testutil.BuildVmsan() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if removeBin != nil {
		removeBin()
	}
	os.Exit(code)
}

// TestCLI runs `vmsan volume` and `vmsan status` as a user would: directly
// on the directory with no daemon, then through a running daemon.
func TestCLI(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	vmsan := func(wantOK bool, args ...string) string {
		t.Helper()
		args = append(args, "--data-dir", dir)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("vmsan %v: err=%v (want ok=%v)\n%s", args, err, wantOK, out)
		}
		return string(out)
	}
	vmsan(true, "volume", "create", "vm1", "--size", "20G", "--cache", "writethrough")
	if out := vmsan(true, "volume", "list"); !regexp.MustCompile(`(?m)^vm1\s+20\.0 GiB\s+0 B\s+writethrough`).MatchString(out) {
		t.Fatalf("list:\n%s", out)
	}
	if out := vmsan(false, "volume", "create", "../etc", "--size", "1G"); !bytes.Contains([]byte(out), []byte("invalid volume name")) {
		t.Fatalf("bad name message:\n%s", out)
	}
	if out := vmsan(false, "volume", "create", "x", "--size", "1000"); !bytes.Contains([]byte(out), []byte("multiple of the logical block size")) {
		t.Fatalf("bad size message:\n%s", out)
	}
	vmsan(false, "volume", "resize", "vm1", "10G")
	vmsan(true, "volume", "resize", "vm1", "10G", "--force")
	if out := vmsan(true, "volume", "info", "vm1", "--json"); !bytes.Contains([]byte(out), []byte(`"size": 10737418240`)) {
		t.Fatalf("info:\n%s", out)
	}
	vmsan(false, "status") // no daemon

	// Flags override the config file.
	cf := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cf, []byte("data_dir: /from/file\nlog_level: debug\nmetrics_listen: 127.0.0.1:9\n"), 0o644)
	out, err := exec.Command(bin, "serve", "--config", cf, "--data-dir", "/from/flag", "--listen", "127.0.0.1:1", "--print-config").CombinedOutput()
	if err != nil {
		t.Fatalf("print-config: %v\n%s", err, out)
	}
	for _, want := range []string{"data_dir: /from/flag", "log_level: debug", "127.0.0.1:1", "metrics_listen: 127.0.0.1:9"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("effective config lacks %q:\n%s", want, out)
		}
	}
	os.WriteFile(cf, []byte("data_dri: typo\n"), 0o644)
	if out, err := exec.Command(bin, "serve", "--config", cf).CombinedOutput(); err == nil || !bytes.Contains(out, []byte(cf+`:1: unknown key "data_dri" (did you mean "data_dir"?)`)) {
		t.Errorf("config typo: err=%v\n%s", err, out)
	}

	r := start(t, dir, nil)
	vmsan(true, "volume", "create", "vm2", "--size", "1G")
	status := vmsan(true, "status")
	for _, want := range []string{"vm1", "vm2", "MERGE RATIO", "listening on 127.0.0.1:"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	vmsan(true, "volume", "delete", "vm2")
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if out := vmsan(true, "volume", "list"); bytes.Contains([]byte(out), []byte("vm2")) {
		t.Fatalf("vm2 not deleted:\n%s", out)
	}
}

func pattern(i int) byte { return byte(i%250 + 1) }
