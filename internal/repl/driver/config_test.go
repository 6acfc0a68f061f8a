package driver

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/volume"
)

func msD(n int) replset.Duration { return replset.Duration(time.Duration(n) * time.Millisecond) }

// A config.json written before settings were durations (tick_ms and
// counts of ticks) reads as the same times, with the tick it ran with, so
// the state machine gets the same ticks; the new layout round-trips.
func TestDecodeSettingsLegacy(t *testing.T) {
	old := `{"listen": "10.0.0.1:7789", "peer": "10.0.0.2:7789", "protocol": "B", "role": "primary", "node_id": 7,
	  "tick_ms": 20, "ping_interval": 5, "ping_timeout": 25, "ko_ticks": 500, "al_retire_ticks": 25, "resync_rate": 1048576}`
	s, err := DecodeSettings([]byte(old))
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Listen: "10.0.0.1:7789", Peer: "10.0.0.2:7789", Protocol: "B", Role: "primary", NodeID: 7,
		Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(500), KoTimeout: msD(10000), ALRetire: msD(500), ResyncRate: 1 << 20}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
	if tk := s.Ticks(); tk.Tick != 20*time.Millisecond || tk.PingInterval != 5 || tk.PingTimeout != 25 || tk.KoTicks != 500 || tk.ALRetireTicks != 25 || tk.ResyncRate != 20971 {
		t.Fatalf("ticks %+v", tk)
	}
	// Without tick_ms, ticks were 100 ms; zero counts meant the defaults.
	s, err = DecodeSettings([]byte(`{"listen": "a:1", "peer": "b:2", "node_id": 1, "ping_timeout": 30}`))
	if err != nil || s.Tick != msD(100) || s.PingTimeout != msD(3000) || s.PingInterval != 0 {
		t.Fatalf("default tick: %+v %v", s, err)
	}
	// The duration layout, as SaveSettings writes it.
	dir := t.TempDir()
	if err := SaveSettings(dir, want); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if !strings.Contains(string(b), `"ping_timeout": "500ms"`) {
		t.Fatalf("config.json: %s", b)
	}
	if got, err := LoadSettings(dir); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
}

// TestConfigureValidatesVolume: `vmsan repl configure ../../x` used to
// write <data_dir>/repl/../../x/config.json, outside the data directory,
// and configure volumes that do not exist. Now the name is validated like
// every volume name and the volume must exist.
func TestConfigureValidatesVolume(t *testing.T) {
	base := t.TempDir()
	dataDir := filepath.Join(base, "data")
	s, err := volume.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(volume.CreateOptions{Name: "vm1", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	set := Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2", SharedSecret: testSecret}
	for _, bad := range []string{"../../x", "../x", "a/b", "/abs", ".hidden", "", "vm1/../../y"} {
		if _, err := Configure(dataDir, bad, set); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("configure %q: %v, want ErrInvalidName", bad, err)
		}
	}
	if _, err := Configure(dataDir, "nope", set); !errors.Is(err, volume.ErrNotFound) || !strings.Contains(err.Error(), "vmsan volume create nope") {
		t.Errorf("configure a volume that does not exist: %v", err)
	}
	// Nothing was written outside the data directory, nor for "nope".
	filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.Name() == "config.json" {
			t.Errorf("settings written to %s", p)
		}
		return nil
	})
	// Without a secret (and not insecure) configuring is refused, naming
	// the key to set; the secret file must be readable and long enough.
	if _, err := Configure(dataDir, "vm1", Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2"}); !errors.Is(err, replset.ErrNoSecret) ||
		!strings.Contains(err.Error(), "shared_secret_file") || !strings.Contains(err.Error(), "--shared-secret-file") {
		t.Errorf("configure without a secret: %v", err)
	}
	short := filepath.Join(base, "short.secret")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	for _, f := range []string{short, filepath.Join(base, "missing.secret")} {
		if _, err := Configure(dataDir, "vm1", Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2", SharedSecretFile: f}); err == nil {
			t.Errorf("configure with secret file %s accepted", f)
		}
	}
	out, err := Configure(dataDir, "vm1", set)
	if err != nil || out.NodeID == 0 {
		t.Fatalf("configure vm1: %+v %v", out, err)
	}
	st, err := os.Stat(filepath.Join(Dir(dataDir, "vm1"), "config.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config.json: %v %v", err, st)
	}
}

// TestCheckDataID: replication state written for another data identity is
// replaced by a never-synced secondary's (generation 0, Inconsistent, no
// bitmap or AL), so the handshake makes it a full sync target; the same or
// an unknown identity keeps the state.
func TestCheckDataID(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := repl.Meta{NodeID: 7, Gens: repl.Generations{Current: 5, Bitmap: 3}, Role: repl.Primary, Disk: repl.UpToDate, CrashedPrimary: true, Clean: true, DataID: "old"}
	words, al := []uint64{1}, []int64{2}
	if got, w, a := checkDataID(m, words, al, true, "old", log); got != m || w == nil || a == nil {
		t.Fatalf("same identity changed the state: %+v", got)
	}
	if got, _, _ := checkDataID(m, words, al, true, "", log); got != m {
		t.Fatalf("unknown identity changed the state: %+v", got)
	}
	legacy := m
	legacy.DataID = ""
	if got, w, _ := checkDataID(legacy, words, al, true, "new", log); got.Gens != m.Gens || got.Disk != repl.UpToDate || got.DataID != "new" || w == nil {
		t.Fatalf("legacy state not adopted: %+v", got)
	}
	got, w, a := checkDataID(m, words, al, true, "new", log)
	want := repl.Meta{NodeID: 7, Role: repl.Secondary, Disk: repl.Inconsistent, DataID: "new"}
	if got != want || w != nil || a != nil {
		t.Fatalf("replaced data: %+v %v %v, want %+v", got, w, a, want)
	}
	// The reset is a full sync target against any peer that has data.
	self := repl.Hello{NodeID: 7, Gens: got.Gens, Disk: got.Disk, Size: 1 << 20}
	peer := repl.Hello{NodeID: 8, Gens: repl.Generations{Current: 9, Bitmap: 5}, Role: repl.Primary, Disk: repl.UpToDate, Size: 1 << 20}
	if d := repl.Decide(self, peer, repl.SBDisconnect); d.Kind != repl.FullTarget {
		t.Fatalf("decision after reset: %+v", d)
	}
}
