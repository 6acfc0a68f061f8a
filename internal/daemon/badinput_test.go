package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// controlHTTP is a plain HTTP client over dir's control socket (for
// requests Client.Do does not make: raw bodies, text replies).
func controlHTTP(dir string) *http.Client {
	sock := filepath.Join(dir, ControlSocketName)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return netutil.DialUnix("unix", sock, func(n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) })
		},
	}}
}

// TestControlBadInput: every control endpoint answers bad input with a 4xx
// and a message, never a 500 (before the fix, `volume create 1E` on a
// filesystem that cannot hold such a file was a 500).
func TestControlBadInput(t *testing.T) {
	dir := t.TempDir()
	r := start(t, dir, nil)
	hc := controlHTTP(dir)
	do := func(method, path, body string) (int, APIError) {
		t.Helper()
		req, err := http.NewRequest(method, "http://vmsan"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ae APIError
		json.Unmarshal(b, &ae)
		return resp.StatusCode, ae
	}
	if st, ae := do("POST", "/v1/volumes", `{"name":"v","size":"4M"}`); st != http.StatusCreated {
		t.Fatalf("setup: %d %+v", st, ae)
	}
	_ = r
	huge := `{"name":"x","size":"1M","description":"` + strings.Repeat("a", 200<<10) + `"}`
	cases := []struct {
		name, method, path, body string
		want                     int // 0: any 4xx
	}{
		{"create 1E", "POST", "/v1/volumes", `{"name":"x","size":"1E"}`, -1},
		{"create 16E", "POST", "/v1/volumes", `{"name":"x","size":"16E"}`, 400},
		{"create huge number", "POST", "/v1/volumes", `{"name":"x","size":"99999999999999999999999"}`, 400},
		{"create negative", "POST", "/v1/volumes", `{"name":"x","size":"-1"}`, 400},
		{"create zero", "POST", "/v1/volumes", `{"name":"x","size":"0"}`, 400},
		{"create fraction", "POST", "/v1/volumes", `{"name":"x","size":"1.3"}`, 400},
		{"create not a number", "POST", "/v1/volumes", `{"name":"x","size":"abc"}`, 400},
		{"create size as number", "POST", "/v1/volumes", `{"name":"x","size":1048576}`, 400},
		{"create unaligned", "POST", "/v1/volumes", `{"name":"x","size":"1000"}`, 400},
		{"create bad name", "POST", "/v1/volumes", `{"name":"../x","size":"1M"}`, 400},
		{"create empty name", "POST", "/v1/volumes", `{"name":"","size":"1M"}`, 400},
		{"create long name", "POST", "/v1/volumes", `{"name":"` + strings.Repeat("n", 300) + `","size":"1M"}`, 400},
		{"create bad cache", "POST", "/v1/volumes", `{"name":"x","size":"1M","cache":"bogus"}`, 400},
		{"create bad block size", "POST", "/v1/volumes", `{"name":"x","size":"1M","block_size":3}`, 400},
		{"create block size overflow", "POST", "/v1/volumes", `{"name":"x","size":"1M","block_size":99999999999}`, 400},
		{"create long description", "POST", "/v1/volumes", `{"name":"x","size":"1M","description":"` + strings.Repeat("d", 2000) + `"}`, 400},
		{"create huge body", "POST", "/v1/volumes", huge, 400},
		{"create bad JSON", "POST", "/v1/volumes", `{"name":`, 400},
		{"create empty body", "POST", "/v1/volumes", ``, 400},
		{"create null", "POST", "/v1/volumes", `null`, 400},
		{"create array", "POST", "/v1/volumes", `[]`, 400},
		{"create unknown field", "POST", "/v1/volumes", `{"name":"x","size":"1M","sise":"2M"}`, 400},
		{"create exists", "POST", "/v1/volumes", `{"name":"v","size":"1M"}`, 409},
		{"info unknown", "GET", "/v1/volumes/nope", ``, 404},
		{"info bad name", "GET", "/v1/volumes/.hidden", ``, 400},
		{"resize unknown", "POST", "/v1/volumes/nope/resize", `{"size":"8M"}`, 404},
		{"resize 1E", "POST", "/v1/volumes/v/resize", `{"size":"1E"}`, -1},
		{"resize 16E", "POST", "/v1/volumes/v/resize", `{"size":"16E"}`, 400},
		{"resize zero", "POST", "/v1/volumes/v/resize", `{"size":"0"}`, 400},
		{"resize unaligned", "POST", "/v1/volumes/v/resize", `{"size":"4097"}`, 400},
		{"resize empty", "POST", "/v1/volumes/v/resize", `{}`, 400},
		{"resize bad JSON", "POST", "/v1/volumes/v/resize", `{"size":`, 400},
		{"resize bad force", "POST", "/v1/volumes/v/resize", `{"size":"1M","force":"yes"}`, 400},
		{"resize shrink", "POST", "/v1/volumes/v/resize", `{"size":"1M"}`, 409},
		{"resize bad name", "POST", "/v1/volumes/..x/resize", `{"size":"8M"}`, 400},
		{"settings unknown", "POST", "/v1/volumes/nope/settings", `{"rotational":true}`, 404},
		{"settings bad cache", "POST", "/v1/volumes/v/settings", `{"cache":"bogus"}`, 400},
		{"settings bad type", "POST", "/v1/volumes/v/settings", `{"read_only":"yes"}`, 400},
		{"settings long description", "POST", "/v1/volumes/v/settings", `{"description":"` + strings.Repeat("d", 2000) + `"}`, 400},
		{"settings bad JSON", "POST", "/v1/volumes/v/settings", `nope`, 400},
		{"delete unknown", "DELETE", "/v1/volumes/nope", ``, 404},
		{"delete bad name", "DELETE", "/v1/volumes/a%2Fb", ``, 400},
		{"delete bad force", "DELETE", "/v1/volumes/v?force=maybe", ``, 400},
		{"unknown endpoint", "GET", "/v1/nothing", ``, 404},
		{"wrong method", "PUT", "/v1/volumes/v", `{}`, 405},
	}
	for _, c := range cases {
		st, ae := do(c.method, c.path, c.body)
		switch {
		case c.want == -1:
			// Whether the filesystem holds a sparse 1 EiB file depends on
			// it (tmpfs does, ext4 does not): success or 4xx, never 5xx.
			if st >= 500 {
				t.Errorf("%s: %d %+v", c.name, st, ae)
			}
			if st == http.StatusCreated {
				do("DELETE", "/v1/volumes/x", "")
			}
			if st == http.StatusOK {
				do("POST", "/v1/volumes/v/resize", `{"size":"4M","force":true}`)
			}
			t.Logf("%s: %d %s", c.name, st, ae.Message)
		case st != c.want:
			t.Errorf("%s: status %d (%+v), want %d", c.name, st, ae, c.want)
		case st < 400 || st >= 500:
			t.Errorf("%s: status %d", c.name, st)
		case ae.Message == "" && st != 404 && st != 405:
			t.Errorf("%s: %d without a message", c.name, st)
		}
	}
	// The daemon still works and nothing was created by the bad requests.
	if st, _ := do("GET", "/v1/volumes/x", ""); st != 404 {
		t.Errorf("volume x exists after the bad creates: %d", st)
	}
	if st, _ := do("GET", "/v1/status", ""); st != 200 {
		t.Errorf("status: %d", st)
	}
}

// TestSocketModesUnderUmask000: the NBD socket (read-write access to every
// volume) and the control socket get their modes explicitly, whatever the
// umask. Before the fix nbd.sock was 0777 under umask 000.
func TestSocketModesUnderUmask000(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	other := filepath.Join(t.TempDir(), "run", "nbd.sock") // outside the data dir
	start(t, dir, func(c *config.Config) {
		c.Listen = []string{"127.0.0.1:0", "unix:" + filepath.Join(dir, "nbd.sock"), "unix:" + other}
	})
	for p, want := range map[string]os.FileMode{
		filepath.Join(dir, "nbd.sock"):        NBDSocketMode,
		other:                                 NBDSocketMode,
		filepath.Join(dir, ControlSocketName): ControlSocketMode,
		dir:                                   0o700,
		filepath.Join(dir, "volumes"):         0o700,
		filepath.Join(dir, "volumes", "default.raw"): 0o600,
	} {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), want)
		}
	}
}

// TestSecondDaemonRefusedWithoutLockFile: removing vmsan.lock while a
// daemon runs does not let a second daemon start on the same directory
// (the flock is on the directory itself).
func TestSecondDaemonRefusedWithoutLockFile(t *testing.T) {
	dir := t.TempDir()
	start(t, dir, nil)
	if err := os.Remove(filepath.Join(dir, volume.LockFileName)); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Listen = []string{"127.0.0.1:0"}
	cfg.LogLevel = "warn"
	d, err := New(cfg, Options{})
	if err == nil {
		d.Shutdown()
		t.Fatal("a second daemon started on the same data directory")
	}
	if !errors.Is(err, volume.ErrLocked) {
		t.Fatalf("second daemon: %v, want ErrLocked", err)
	}
}

// TestDamagedConfigVolume: a volume declared in the config whose raw file
// is missing is not recreated, not grown to its configured size, and does
// not keep the daemon (or the other volumes) from starting; info says how
// to repair it.
func TestDamagedConfigVolume(t *testing.T) {
	dir := t.TempDir()
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"c", "ok"} {
		if _, err := s.Create(volume.CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	raw := s.RawPath("c")
	s.Close()
	os.Remove(raw)
	r := start(t, dir, func(c *config.Config) {
		c.Volumes = []config.Volume{{Name: "c", Size: 2 << 20}, {Name: "ok", Size: 1 << 20}}
	})
	if _, err := os.Stat(raw); !os.IsNotExist(err) {
		t.Fatalf("missing raw file recreated: %v", err)
	}
	vols := *r.d.vols.Load()
	if vols["c"] != nil || vols["ok"] == nil {
		t.Fatalf("exported: c=%v ok=%v", vols["c"] != nil, vols["ok"] != nil)
	}
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	vi, err := c.Info("c")
	if err != nil || vi.Size != 1<<20 || !strings.Contains(vi.Problem, "vmsan volume repair c --recreate") {
		t.Fatalf("info: %+v %v", vi, err)
	}
}
