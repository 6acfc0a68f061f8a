package driver

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/volume"
)

// Durations from the config file become ticks: the tick is a tenth of the
// ping interval (10..100 ms) and every timeout rounds up.
func TestSettingsFromConfig(t *testing.T) {
	d := func(s string) config.Duration { v, _ := time.ParseDuration(s); return config.Duration(v) }
	s := SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", Protocol: "b",
		PingInterval: d("1s"), PingTimeout: d("6s"), KoTimeout: d("10s"), ResyncRate: 100 << 20})
	want := Settings{Listen: "a:1", Peer: "b:2", Protocol: "B", Role: "secondary", SplitBrain: "disconnect", Dial: "auto",
		TickMillis: 100, PingInterval: 10, PingTimeout: 60, KoTicks: 100, ALRetireTicks: 50, ResyncRate: 100 << 20}
	if s != want {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
	s = SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", PingInterval: d("150ms"), PingTimeout: d("1s"), KoTimeout: d("25ms")})
	if s.TickMillis != 15 || s.PingInterval != 10 || s.PingTimeout != 67 || s.KoTicks != 2 || s.ALRetireTicks != 334 {
		t.Fatalf("fast pings: %+v", s)
	}
	s = SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", PingInterval: d("20ms"), PingTimeout: d("50ms")})
	if s.TickMillis != 10 || s.PingInterval != 2 || s.PingTimeout != 5 {
		t.Fatalf("tick floor: %+v", s)
	}
	s.NodeID = 1
	if err := s.Validate(); err != nil {
		t.Fatal(err)
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
	set := Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2"}
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
