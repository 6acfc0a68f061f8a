package bench

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// TestLargeExportsOtherServers runs a write benchmark (what `vmsan bench`
// runs: Execute, with the hole probe before and the hole restore after)
// against the NBD servers people run, on exports of 8 GiB: more than one
// 32-bit BLOCK_STATUS request covers. nbdkit 1.32's memory plugin aborts
// when asked for the status of 0xFFFFFFFF bytes; the probe must ask in
// pieces it handles (and clip what comes back), map the whole export, and
// punch what the run allocated, leaving the server running.
func TestLargeExportsOtherServers(t *testing.T) {
	const size = 8 << 30
	servers := map[string]func(t *testing.T, sock string) []string{
		"nbdkit-memory": func(t *testing.T, sock string) []string {
			return []string{testutil.NeedTool(t, "nbdkit"), "-f", "--exit-with-parent", "-U", sock, "memory", "8G"}
		},
		"qemu-nbd": func(t *testing.T, sock string) []string {
			img := filepath.Join(testutil.DiskTempDir(t), "disk.raw")
			if err := os.WriteFile(img, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(img, size); err != nil {
				t.Fatal(err)
			}
			return []string{testutil.NeedTool(t, "qemu-nbd"), "-f", "raw", "-k", sock, "--discard=unmap", "--cache=none", "--aio=threads", img}
		},
	}
	for name, argv := range servers {
		t.Run(name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "s")
			srv := startServerProcess(t, sock, argv(t, sock))
			dir := t.TempDir()
			cfg := RunConfig{
				Target: "nbd+unix:///?socket=" + sock, Size: 4 << 20, Out: filepath.Join(dir, "r.json"), Quiet: true,
				Options: Options{Profile: ProfileJob, Seed: 1, Job: JobSpec{RW: RandWrite, BS: 64 << 10, QD: 4, Size: 4 << 20, Runtime: 200 * time.Millisecond}},
			}
			if err := Execute(context.Background(), cfg, devNull(t), devNull(t)); err != nil {
				t.Fatalf("bench: %v\nserver: %s", err, srv.stderr.String())
			}
			r, err := LoadResult(cfg.Out)
			if err != nil {
				t.Fatal(err)
			}
			if r.Target.Size != size {
				t.Fatalf("target size %d, want %d", r.Target.Size, size)
			}
			restored := false
			for _, n := range r.Notes {
				if strings.Contains(n, "not restored") || strings.Contains(n, "failed") {
					t.Fatalf("note: %s\nserver: %s", n, srv.stderr.String())
				}
				restored = restored || strings.Contains(n, "holes restored")
			}
			if !restored {
				t.Fatalf("the run's allocation was not punched back (notes %q)", r.Notes)
			}
			select {
			case <-srv.done:
				t.Fatalf("%s exited: %s", name, srv.stderr.String())
			default:
			}
		})
	}
}

type serverProcess struct {
	stderr bytes.Buffer
	done   chan struct{}
}

// startServerProcess starts argv (an NBD server listening on the Unix
// socket sock), waits until the socket accepts and stops it in Cleanup.
func startServerProcess(t *testing.T, sock string, argv []string) *serverProcess {
	t.Helper()
	s := &serverProcess{done: make(chan struct{})}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = &s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-s.done })
	for i := 0; i < 500; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("%s exited at start: %s", argv[0], s.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not start: %s", argv[0], s.stderr.String())
	return nil
}
