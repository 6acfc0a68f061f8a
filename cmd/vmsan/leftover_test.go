package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// syncBuf is a bytes.Buffer safe to read while a process writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// daemonProc is a `vmsan serve` process on a data directory.
type daemonProc struct {
	cmd    *exec.Cmd
	log    *syncBuf
	exited chan struct{}
}

// startServe starts `vmsan serve` on data (a Unix NBD socket only) and
// waits for its control socket.
func startServe(t *testing.T, data string) *daemonProc {
	t.Helper()
	d := &daemonProc{log: &syncBuf{}, exited: make(chan struct{})}
	d.cmd = exec.Command(binary(t), "serve", "--data-dir", data, "--listen", "unix:"+filepath.Join(data, "nbd.sock"))
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	os.Remove(filepath.Join(data, "control.sock"))
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, code := exitCode(t, "status", "--data-dir", data); code == 0 {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("vmsan serve exited:\n%s", d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vmsan serve did not start:\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the exit.
func (d *daemonProc) stop(t *testing.T) {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("vmsan serve did not stop on SIGTERM:\n%s", d.log.String())
	}
}

// randomVolume makes volume v in data (offline) holding size bytes of
// random data, so that copying it takes a moment.
func randomVolume(t *testing.T, data string, size int64) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "rand.raw")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	vmsan(t, "volume", "import", "--data-dir", data, "-q", "v", src)
	os.Remove(src)
}

// waitFor polls (every millisecond: the windows are short) until a file
// matching pattern exists, or the process done exits first (false).
func waitFor(t *testing.T, pattern string, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return true
		}
		select {
		case <-done:
			return false
		default:
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no %s within 60 s", pattern)
	return false
}

// cliProc starts a CLI command in the background.
func cliProc(t *testing.T, args ...string) (*exec.Cmd, *syncBuf, chan struct{}) {
	t.Helper()
	c := exec.Command(binary(t), args...)
	out := &syncBuf{}
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	t.Cleanup(func() { c.Process.Kill(); <-done })
	return c, out, done
}

// TestExportSurvivesDaemonStop: the daemon stops (SIGTERM) while `volume
// export` reads its temporary snapshot. The export completes, the
// temporary snapshot is deleted anyway (on the now free data directory)
// and the command exits 0; nothing named tmp-export is left on disk.
// (Before: the snapshot stayed, with a warning, and exit status 0.)
func TestExportSurvivesDaemonStop(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	randomVolume(t, data, 256<<20)
	out := filepath.Join(tmp, "out.raw")
	c, msg, done := exportHeldDaemonStopped(t, data, out)
	c.Process.Signal(syscall.SIGCONT)
	<-done
	if code := c.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("export after the daemon stopped: exit %d\n%s", code, msg.String())
	}
	if m, _ := filepath.Glob(filepath.Join(data, "snapshots", "v", "*.json")); len(m) != 0 {
		t.Fatalf("temporary snapshot left behind: %v\n%s", m, msg.String())
	}
	if sha(t, out) != sha(t, filepath.Join(data, "volumes", "v.raw")) {
		t.Fatal("the export differs from the volume")
	}
}

// TestExportCleanupFailureExitsNonZero: as above, but the temporary
// snapshot cannot be removed (its directory made immutable with chattr
// +i, which stops root too): the export must not exit 0 as if all were
// well; it exits non-zero and names the snapshot left behind.
func TestExportCleanupFailureExitsNonZero(t *testing.T) {
	testutil.NeedTool(t, "chattr")
	tmp := testutil.DiskTempDir(t)
	data := filepath.Join(tmp, "data")
	randomVolume(t, data, 64<<20)
	c, msg, done := exportHeldDaemonStopped(t, data, filepath.Join(tmp, "out.raw"))
	dir := filepath.Join(data, "snapshots", "v")
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		c.Process.Signal(syscall.SIGCONT)
		<-done
		testutil.SkipOrFail(t, "chattr +i on %s (the filesystem must support it): %v %s", dir, err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", dir).Run() })
	c.Process.Signal(syscall.SIGCONT)
	<-done
	if code := c.ProcessState.ExitCode(); code == 0 {
		t.Fatalf("export exited 0 with its temporary snapshot not removed:\n%s", msg.String())
	}
	if !strings.Contains(msg.String(), "v@tmp-export-") {
		t.Fatalf("the failure does not name the snapshot left behind:\n%s", msg.String())
	}
	t.Logf("export: exit %d: %s", c.ProcessState.ExitCode(), msg.String())
}

// exportHeldDaemonStopped starts a daemon on data and `volume export
// --copy v out`, stops the export (SIGSTOP) between taking its temporary
// snapshot and deleting it, and stops the daemon meanwhile; the export is
// returned stopped. Up to 5 attempts when the export got past its delete
// before the SIGSTOP.
func exportHeldDaemonStopped(t *testing.T, data, out string) (*exec.Cmd, *syncBuf, chan struct{}) {
	t.Helper()
	snaps := filepath.Join(data, "snapshots", "v", "*.json")
	for attempt := 1; ; attempt++ {
		d := startServe(t, data)
		os.Remove(out)
		c, msg, done := cliProc(t, "volume", "export", "--data-dir", data, "--copy", "-q", "v", out)
		if !waitFor(t, snaps, done) {
			t.Fatalf("export ended before its temporary snapshot was seen:\n%s", msg.String())
		}
		c.Process.Signal(syscall.SIGSTOP)
		if m, _ := filepath.Glob(snaps); len(m) == 0 {
			// It got past the delete before the stop: try again.
			c.Process.Signal(syscall.SIGCONT)
			<-done
			d.stop(t)
			if attempt == 5 {
				t.Fatal("could not stop the export while it read its snapshot in 5 attempts")
			}
			continue
		}
		d.stop(t)
		return c, msg, done
	}
}

// TestTempSnapshotRemovedAtStart: an export killed (SIGKILL) after taking
// its temporary snapshot leaves it; the daemon's next start removes it
// (and says so), and keeps the user's own snapshots.
func TestTempSnapshotRemovedAtStart(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	randomVolume(t, data, 64<<20)
	vmsan(t, "volume", "snapshot", "--data-dir", data, "--copy", "v", "keep")
	d := startServe(t, data)
	c, msg, done := cliProc(t, "volume", "export", "--data-dir", data, "--copy", "-q", "v", filepath.Join(tmp, "out.raw"))
	temp := filepath.Join(data, "snapshots", "v", "tmp-export-*.json")
	if !waitFor(t, temp, done) {
		t.Fatalf("export ended before its temporary snapshot was seen:\n%s", msg.String())
	}
	c.Process.Kill()
	<-done
	if m, _ := filepath.Glob(temp); len(m) == 0 {
		t.Fatal("the killed export deleted its snapshot: nothing left to test")
	}
	d.stop(t)
	d = startServe(t, data)
	if m, _ := filepath.Glob(filepath.Join(data, "snapshots", "v", "tmp-export-*")); len(m) != 0 {
		t.Fatalf("the daemon's start left the temporary snapshot: %v\n%s", m, d.log.String())
	}
	if !strings.Contains(d.log.String(), "removed the temporary snapshot v@tmp-export-") {
		t.Errorf("the start did not log the removal:\n%s", d.log.String())
	}
	if l := vmsan(t, "volume", "list", "--snapshots", "--data-dir", data); !strings.Contains(l, "v@keep") {
		t.Fatalf("the user's snapshot went too:\n%s", l)
	}
}

// TestImportDaemonStopped: the daemon stops (SIGTERM) while `volume
// import` copies the image into the data directory. The import fails
// saying the daemon stopped and nothing was created, and that is true:
// no volume, no temporary file.
func TestImportDaemonStopped(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	vmsan(t, "volume", "create", "--data-dir", data, "other", "--size", "1M")
	src := filepath.Join(tmp, "src.raw")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, 256<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d := startServe(t, data)
	c, msg, done := cliProc(t, "volume", "import", "--data-dir", data, "-q", "n", src)
	if !waitFor(t, filepath.Join(data, "volumes", ".atomic-tmp-import-*"), done) {
		t.Fatalf("import ended before its copy was seen:\n%s", msg.String())
	}
	c.Process.Signal(syscall.SIGSTOP) // the daemon stops before the import asks it to create the volume
	d.stop(t)
	c.Process.Signal(syscall.SIGCONT)
	<-done
	if code := c.ProcessState.ExitCode(); code == 0 || !strings.Contains(msg.String(), "the daemon stopped; nothing was created") ||
		strings.Contains(msg.String(), "http://") {
		t.Fatalf("import with the daemon gone: exit %d\n%s", code, msg.String())
	}
	if m, _ := filepath.Glob(filepath.Join(data, "volumes", "n.*")); len(m) != 0 {
		t.Fatalf("the failed import left %v", m)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "volumes", ".atomic-tmp-*")); len(m) != 0 {
		t.Fatalf("the failed import left its temporary file %v", m)
	}
}

// TestExportInterrupted: SIGTERM to `volume export` while it writes the
// image: it exits 1 saying so, removes the partial image, and deletes its
// temporary snapshot (the daemon keeps running).
func TestExportInterrupted(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	randomVolume(t, data, 256<<20)
	startServe(t, data)
	out := filepath.Join(tmp, "out.raw")
	snaps := filepath.Join(data, "snapshots", "v", "tmp-export-*.json")
	for attempt := 1; ; attempt++ {
		os.Remove(out)
		c, msg, done := cliProc(t, "volume", "export", "--data-dir", data, "--copy", "-q", "v", out)
		if !waitFor(t, snaps, done) {
			t.Fatalf("export ended before its temporary snapshot was seen:\n%s", msg.String())
		}
		// Stopped while it reads the snapshot, the signal is delivered
		// when it continues: in the middle of the copy.
		c.Process.Signal(syscall.SIGSTOP)
		if m, _ := filepath.Glob(snaps); len(m) == 0 {
			c.Process.Signal(syscall.SIGCONT)
			<-done
			if attempt == 5 {
				t.Fatal("could not stop the export while it read its snapshot in 5 attempts")
			}
			continue
		}
		c.Process.Signal(syscall.SIGTERM)
		c.Process.Signal(syscall.SIGCONT)
		<-done
		if code := c.ProcessState.ExitCode(); code != 1 || !strings.Contains(msg.String(), "export interrupted") {
			t.Fatalf("interrupted export: exit %d\n%s", code, msg.String())
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("the partial image stayed")
		}
		if m, _ := filepath.Glob(filepath.Join(data, "snapshots", "v", "tmp-export-*")); len(m) != 0 {
			t.Errorf("temporary snapshot left: %v", m)
		}
		return
	}
}
