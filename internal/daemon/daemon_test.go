package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// syncBuffer is a bytes.Buffer safe for the daemon goroutine to write while
// the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type running struct {
	d    *Daemon
	out  *syncBuffer
	stop func() error // cancels Run and returns its error
	dir  string
}

func (r *running) tcp() string         { return r.d.NBDAddrs()[0].String() }
func (r *running) url(e string) string { return "nbd://" + r.tcp() + "/" + e }

// start runs a daemon in-process on an ephemeral TCP port plus a Unix socket
// in dir; mutate adjusts the configuration first.
func start(t *testing.T, dir string, mutate func(*config.Config)) *running {
	t.Helper()
	return startOpts(t, dir, mutate, nil)
}

// startOpts is start with opts adjusting the daemon's Options.
func startOpts(t *testing.T, dir string, mutate func(*config.Config), opts func(*Options)) *running {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Listen = []string{"127.0.0.1:0", "unix:" + filepath.Join(dir, "nbd.sock")}
	cfg.LogLevel = "warn"
	if mutate != nil {
		mutate(&cfg)
	}
	out := &syncBuffer{}
	o := Options{Out: out, ShutdownTimeout: 20 * time.Second}
	if opts != nil {
		opts(&o)
	}
	d, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(60 * time.Second):
				runErr = errors.New("daemon did not stop within 60s")
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	// Wait for the control socket to answer (Run serves it).
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := Dial(dir)
		if err == nil {
			_, err = c.Status()
			c.Close()
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("control socket not answering: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &running{d: d, out: out, stop: stop, dir: dir}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func nbdSize(t *testing.T, uri string) int64 {
	t.Helper()
	s := strings.TrimSpace(run(t, "nbdinfo", "--size", uri))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("nbdinfo --size %s: %q", uri, s)
	}
	return n
}

// TestServeDefault: an empty data dir gets a 10 GiB sparse "default" volume,
// served on TCP and the Unix socket, and the banner prints the exact QEMU
// options for the real port.
func TestServeDefault(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	r := start(t, dir, nil)
	port := r.d.NBDAddrs()[0].(*net.TCPAddr).Port
	banner := r.out.String()
	for _, want := range []string{
		fmt.Sprintf("-drive file=nbd://127.0.0.1:%d/default,format=raw,if=virtio,cache=none", port),
		fmt.Sprintf("-blockdev driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=%d,export=default,node-name=disk0", port),
		fmt.Sprintf("nbdinfo nbd://127.0.0.1:%d/default", port),
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}
	if n := nbdSize(t, r.url("default")); n != 10<<30 {
		t.Fatalf("default volume size %d", n)
	}
	sock := filepath.Join(dir, "nbd.sock")
	if n := nbdSize(t, "nbd+unix:///default?socket="+sock); n != 10<<30 {
		t.Fatalf("over unix socket: size %d", n)
	}
	// The empty export name resolves to "default".
	if n := nbdSize(t, "nbd://"+r.tcp()); n != 10<<30 {
		t.Fatalf("empty export name: size %d", n)
	}
	js := run(t, "nbdinfo", "--json", r.url("default"))
	for _, want := range []string{`"can_multi_conn": true`, `"is_read_only": false`, `"is_rotational": false`} {
		if !strings.Contains(js, want) {
			t.Errorf("nbdinfo --json lacks %s:\n%s", want, js)
		}
	}
	c, _ := Dial(dir)
	// Metrics are served on the control socket too (text format, so not
	// through Client.Do, which decodes JSON).
	var metricsText string
	req, _ := http.NewRequest("GET", "http://vmsan/metrics", nil)
	if resp, err := controlHTTP(dir).Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metricsText = string(b)
	}
	if !strings.Contains(metricsText, `vmsan_volume_size_bytes{volume="default"} 1.073741824e+10`) {
		t.Errorf("metrics over the control socket:\n%.2000s", metricsText)
	}
	vi, err := c.Info("default")
	if err != nil {
		t.Fatal(err)
	}
	if vi.Allocated > 1<<20 {
		t.Fatalf("default volume not sparse: %d bytes allocated", vi.Allocated)
	}
	// A second daemon on the same data dir is refused.
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Listen = []string{"127.0.0.1:0"}
	if _, err := New(cfg, Options{}); !errors.Is(err, volume.ErrLocked) {
		t.Fatalf("second daemon on same dir: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ControlSocketName)); !os.IsNotExist(err) {
		t.Fatalf("control socket left after shutdown: %v", err)
	}
}

// qemuIOSession keeps one NBD connection open with an interactive qemu-io.
type qemuIOSession struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func openQemuIO(t *testing.T, uri string) *qemuIOSession {
	t.Helper()
	cmd := exec.Command("qemu-io", "-f", "raw", uri)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &qemuIOSession{cmd: cmd, stdin: in}
	t.Cleanup(func() { s.close() })
	return s
}

func (s *qemuIOSession) close() {
	if s.stdin != nil {
		io.WriteString(s.stdin, "quit\n")
		s.stdin.Close()
		s.stdin = nil
		done := make(chan struct{})
		go func() { s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-done
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestVolumeOpsThroughDaemon drives create/resize/delete through the control
// socket while the daemon runs (so exports are respected), then directly on
// the directory after it stops.
func TestVolumeOpsThroughDaemon(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-io")
	dir := t.TempDir()
	r := start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })

	ops, via, err := OpenVolumeOps(dir)
	if err != nil || !via {
		t.Fatalf("OpenVolumeOps with daemon running: via=%v err=%v", via, err)
	}
	defer ops.Close()
	if _, err := ops.Create(volume.CreateOptions{Name: "vm1", Size: 1 << 30, Rotational: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Create(volume.CreateOptions{Name: "vm1", Size: 1 << 30}); !errors.Is(err, volume.ErrExists) {
		t.Fatalf("duplicate create over the socket: %v", err)
	}
	if _, err := ops.Create(volume.CreateOptions{Name: "a/b", Size: 1 << 30}); !errors.Is(err, volume.ErrInvalidName) {
		t.Fatalf("bad name over the socket: %v", err)
	}
	// New volume is exported at once.
	if n := nbdSize(t, r.url("vm1")); n != 1<<30 {
		t.Fatalf("size %d", n)
	}
	if js := run(t, "nbdinfo", "--json", r.url("vm1")); !strings.Contains(js, `"is_rotational": true`) {
		t.Fatalf("rotational hint not advertised:\n%s", js)
	}

	// Grow online while a client is connected; a new connection sees it.
	q := openQemuIO(t, r.url("vm1"))
	waitFor(t, "qemu-io to connect", func() bool {
		vi, err := ops.Info("vm1")
		return err == nil && vi.Exports > 0
	})
	if _, err := ops.Resize("vm1", 3<<30, false); err != nil {
		t.Fatal(err)
	}
	if n := nbdSize(t, r.url("vm1")); n != 3<<30 {
		t.Fatalf("size after online grow: %d", n)
	}
	if _, err := ops.Resize("vm1", 1<<30, false); !errors.Is(err, volume.ErrShrink) {
		t.Fatalf("shrink without force: %v", err)
	}
	// Delete refused while exported.
	if err := ops.Delete("vm1", false); !errors.Is(err, volume.ErrInUse) {
		t.Fatalf("delete while connected: %v", err)
	}
	if n := nbdSize(t, r.url("vm1")); n != 3<<30 {
		t.Fatalf("volume damaged by refused delete: size %d", n)
	}
	st, err := ops.(*Client).Status()
	if err != nil || len(st.Volumes) != 1 || st.Volumes[0].Engine == nil {
		t.Fatalf("status: %+v %v", st, err)
	}
	q.close()
	waitFor(t, "qemu-io to disconnect", func() bool {
		vi, err := ops.Info("vm1")
		return err == nil && vi.Exports == 0
	})
	if err := ops.Delete("vm1", false); err != nil {
		t.Fatalf("delete after disconnect: %v", err)
	}
	if out, err := exec.Command("nbdinfo", "--size", r.url("vm1")).CombinedOutput(); err == nil {
		t.Fatalf("deleted volume still served: %s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", "vm1.raw")); !os.IsNotExist(err) {
		t.Fatalf("raw file left: %v", err)
	}

	// Forced delete while connected: the client's next I/O fails.
	if _, err := ops.Create(volume.CreateOptions{Name: "vm2", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	q2 := openQemuIO(t, r.url("vm2"))
	waitFor(t, "qemu-io to connect", func() bool {
		vi, err := ops.Info("vm2")
		return err == nil && vi.Exports > 0
	})
	if err := ops.Delete("vm2", true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	q2.close()

	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	// No daemon: the same operations work on the directory.
	ops2, via, err := OpenVolumeOps(dir)
	if err != nil || via {
		t.Fatalf("OpenVolumeOps without daemon: via=%v err=%v", via, err)
	}
	if _, err := ops2.Create(volume.CreateOptions{Name: "offline", Size: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops2.Resize("offline", 128<<20, false); err != nil {
		t.Fatal(err)
	}
	l, err := ops2.List()
	if err != nil || len(l) != 1 || l[0].Name != "offline" || l[0].Size != 128<<20 {
		t.Fatalf("offline list: %+v %v", l, err)
	}
	ops2.Close()
	// ...and the next daemon serves what was created offline.
	r2 := start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })
	if n := nbdSize(t, r2.url("offline")); n != 128<<20 {
		t.Fatalf("offline-created volume size %d", n)
	}
}

// TestDataSurvivesRestart writes patterns with qemu-io, restarts the daemon,
// and reads them back; it also checks metrics count the writes.
func TestDataSurvivesRestart(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	dir := t.TempDir()
	r := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		c.MetricsListen = "127.0.0.1:0"
		c.Pprof = true
		c.Volumes = []config.Volume{{Name: "disk", Size: 64 << 20, Cache: "writeback"}, {Name: "direct", Size: 16 << 20, Cache: "none"}}
	})
	if _, ok := (*r.d.vols.Load())["direct"]; !ok {
		t.Fatal("cache=none volume not opened (does the test filesystem support O_DIRECT?)")
	}
	// cache=none (O_DIRECT) through the whole stack, including an unaligned
	// write the backend must bounce.
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x5e 4096 64k", "-c", "write -P 0x6f 100 1000", "-c", "flush", r.url("direct"))
	run(t, "qemu-io", "-f", "raw", "-c", "read -P 0x5e 8192 60k", "-c", "read -P 0x6f 100 1000", "-c", "read -P 0 0 100", r.url("direct"))
	uri := r.url("disk")
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0xa5 0 1M", "-c", "write -P 0x3c 8M 64k", "-c", "write -z 4M 1M", "-c", "flush", uri)
	run(t, "qemu-io", "-f", "raw", "-c", "read -P 0xa5 0 1M", "-c", "read -P 0x3c 8M 64k", uri)

	resp, err := http.Get("http://" + r.d.MetricsAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var writes float64 = -1
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `vmsan_engine_requests_total{op="write",volume="disk"} `) {
			writes, _ = strconv.ParseFloat(strings.Fields(line)[1], 64)
		}
	}
	if writes < 2 {
		t.Fatalf("metrics: engine write requests = %v, want >= 2\n%s", writes, body)
	}
	for _, want := range []string{"vmsan_nbd_connections_accepted_total", `vmsan_volume_size_bytes{volume="disk"} 6.7108864e+07`, "vmsan_engine_request_latency_seconds_bucket"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
	resp, err = http.Get("http://" + r.d.MetricsAddr().String() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("goroutine profile")) {
		t.Fatalf("pprof: %d\n%.300s", resp.StatusCode, body)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	r2 := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		// The edited config grows the volume and turns the rotational hint on.
		c.Volumes = []config.Volume{{Name: "disk", Size: 128 << 20, Rotational: true}}
	})
	uri = r2.url("disk")
	run(t, "qemu-io", "-f", "raw", "-c", "read -P 0xa5 0 1M", "-c", "read -P 0x3c 8M 64k", "-c", "read -P 0 4M 1M", uri)
	if n := nbdSize(t, uri); n != 128<<20 {
		t.Fatalf("config did not grow volume: %d", n)
	}
	if c, err := Dial(dir); err != nil {
		t.Fatal(err)
	} else if vi, err := c.Info("disk"); err != nil || !vi.Rotational || vi.Cache != "writeback" {
		t.Fatalf("config settings not applied: %+v %v", vi, err)
	}
}

// TestLongDataDir: sockets in a data directory whose path is longer than
// sun_path allows still work (bound and dialled via /proc/self/fd).
func TestLongDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if len(filepath.Join(dir, ControlSocketName)) <= netutil.MaxSunPath {
		t.Fatal("test path not long enough")
	}
	r := start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })
	ops, via, err := OpenVolumeOps(dir)
	if err != nil || !via {
		t.Fatalf("via=%v err=%v", via, err)
	}
	defer ops.Close()
	if _, err := ops.Create(volume.CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, ControlSocketName))
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("control socket at its real path: %v %v", st, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ControlSocketName)); !os.IsNotExist(err) {
		t.Fatalf("control socket not removed: %v", err)
	}
}

// TestReadOnlyVolume: a read-only volume is advertised read-only and a
// write through a real client fails without changing data.
func TestReadOnlyVolume(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	// Put data in the volume while it is still writable.
	r := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		c.Volumes = []config.Volume{{Name: "base", Size: 16 << 20}}
	})
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x77 0 64k", r.url("base"))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update("base", func(m *volume.Meta) error { m.ReadOnly = true; return nil }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	r = start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })
	if js := run(t, "nbdinfo", "--json", r.url("base")); !strings.Contains(js, `"is_read_only": true`) {
		t.Fatalf("not advertised read-only:\n%s", js)
	}
	out, err := exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 64k", r.url("base")).CombinedOutput()
	if err == nil && !strings.Contains(string(out), "rror") && !strings.Contains(string(out), "read-only") && !strings.Contains(string(out), "denied") {
		t.Fatalf("write to read-only volume seemed to succeed:\n%s", out)
	}
	run(t, "qemu-io", "-f", "raw", "-r", "-c", "read -P 0x77 0 64k", r.url("base"))
}

// TestUpdateSettings changes the rotational hint and read-only flag of a
// live volume through the control socket: refused while a client is
// connected, applied (by reopening) when idle, data kept.
func TestUpdateSettings(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	r := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		c.Volumes = []config.Volume{{Name: "v", Size: 16 << 20}}
	})
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x42 1M 128k", r.url("v"))
	yes := true
	q := openQemuIO(t, r.url("v"))
	waitFor(t, "qemu-io to connect", func() bool {
		vi, err := c.Info("v")
		return err == nil && vi.Exports > 0
	})
	if _, err := c.Update("v", Settings{Rotational: &yes}); !errors.Is(err, volume.ErrInUse) {
		t.Fatalf("update while connected: %v", err)
	}
	q.close()
	waitFor(t, "qemu-io to disconnect", func() bool {
		vi, err := c.Info("v")
		return err == nil && vi.Exports == 0
	})
	none := "bogus"
	if _, err := c.Update("v", Settings{Cache: &none}); err == nil {
		t.Fatal("bogus cache mode accepted")
	}
	vi, err := c.Update("v", Settings{Rotational: &yes, ReadOnly: &yes})
	if err != nil || !vi.Rotational || !vi.ReadOnly {
		t.Fatalf("update: %+v %v", vi, err)
	}
	js := run(t, "nbdinfo", "--json", r.url("v"))
	if !strings.Contains(js, `"is_rotational": true`) || !strings.Contains(js, `"is_read_only": true`) {
		t.Fatalf("new settings not advertised:\n%s", js)
	}
	run(t, "qemu-io", "-f", "raw", "-r", "-c", "read -P 0x42 1M 128k", r.url("v"))
}

// TestCorruptVolumeDoesNotStopDaemon: one volume with unreadable metadata is
// reported and skipped; the others are served, and no default volume is
// created over the top of it.
func TestCorruptVolumeDoesNotStopDaemon(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(volume.CreateOptions{Name: "good", Size: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.WriteFile(filepath.Join(dir, "volumes", "bad.json"), []byte(`{"name": "bad", "size": `), 0o644)
	r := start(t, dir, nil)
	if n := nbdSize(t, r.url("good")); n != 4<<20 {
		t.Fatalf("good volume size %d", n)
	}
	vols := *r.d.vols.Load()
	if _, ok := vols["default"]; ok {
		t.Fatal("default volume created although the directory has volumes")
	}
	if _, ok := vols["bad"]; ok {
		t.Fatal("corrupt volume exported")
	}
}

// TestDamagedRawFile: a volume whose raw file is not a regular file is not
// exported, and does not stop the store or the daemon.
func TestDamagedRawFile(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"ok", "broken"} {
		if _, err := s.Create(volume.CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	raw := filepath.Join(dir, "volumes", "broken.raw")
	os.Remove(raw)
	os.Mkdir(raw, 0o755)
	r := start(t, dir, nil)
	if n := nbdSize(t, r.url("ok")); n != 1<<20 {
		t.Fatalf("ok volume: %d", n)
	}
	if _, ok := (*r.d.vols.Load())["broken"]; ok {
		t.Fatal("volume with a directory as its raw file was exported")
	}
}
