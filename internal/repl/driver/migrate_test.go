package driver

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/volume"
)

const migSize = 8 << 20

// migDataDir is a data directory with volume vm1, and replication state
// for it written in the old layout (<data_dir>/repl/vm1): settings, and a
// meta.json + bitmap.bin with a known generation and two dirty chunks.
func migDataDir(t *testing.T) (dataDir string, set Settings, m repl.Meta, words []uint64) {
	t.Helper()
	dataDir = t.TempDir()
	s, err := volume.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := s.Create(volume.CreateOptions{Name: "vm1", Size: migSize})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	set = Settings{Listen: freeAddr(t), Peer: freeAddr(t), Dial: "no", NodeID: 77, Tick: msD(20), SharedSecret: testSecret}
	old := legacyDir(dataDir, "vm1")
	if err := SaveSettings(old, set); err != nil {
		t.Fatal(err)
	}
	m = repl.Meta{NodeID: 77, Gens: repl.Generations{Current: 0x1234, Bitmap: 0x99}, Role: repl.Secondary, Disk: repl.UpToDate, Clean: true, DataID: vm.DataID}
	nchunks := (migSize + repl.ChunkSize - 1) / repl.ChunkSize
	words = make([]uint64, (nchunks+63)/64)
	words[0] = 0b101 // chunks 0 and 2 out of sync
	if err := (&state{dir: old}).persist(repl.Persist{Meta: &m, Bitmap: words, BitmapChanged: true}); err != nil {
		t.Fatal(err)
	}
	return dataDir, set, m, words
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestMigrateOldLayout: state in <data_dir>/repl/<vol> moves into the
// volume's state directory at start, and a replica started there reads
// the same generations and bitmap it would have read from the old place.
func TestMigrateOldLayout(t *testing.T) {
	dataDir, set, m, _ := migDataDir(t)
	var logBuf strings.Builder
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	if err := Migrate(dataDir, log); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "repl")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old repl directory still there: %v", err)
	}
	if !strings.Contains(logBuf.String(), "replication state moved") || !strings.Contains(logBuf.String(), Dir(dataDir, "vm1")) {
		t.Fatalf("no log line for the move: %q", logBuf.String())
	}
	sd, _ := volume.StatePath(dataDir, "vm1")
	if Dir(dataDir, "vm1") != filepath.Join(sd, "repl") {
		t.Fatalf("Dir %s is not in the state directory %s", Dir(dataDir, "vm1"), sd)
	}
	got, err := LoadSettings(Dir(dataDir, "vm1"))
	if err != nil || !reflect.DeepEqual(got, set) {
		t.Fatalf("settings after the move: %+v %v, want %+v", got, err, set)
	}
	// A second start has nothing to do.
	if err := Migrate(dataDir, log); err != nil {
		t.Fatal(err)
	}

	// Restart: a replica over the volume reads the moved state.
	be, err := backend.OpenFile(filepath.Join(dataDir, volume.VolumesDir, "vm1.raw"), backend.CacheWriteback, false)
	if err != nil {
		t.Fatal(err)
	}
	dev := &engDev{be: be, eng: ioengine.New(be, ioengine.Config{})}
	defer func() { dev.eng.Close(); be.Close() }()
	r, err := Start(Options{Name: "vm1", Dir: Dir(dataDir, "vm1"), Device: dev, Settings: set, Logger: quietLog(), DataID: m.DataID})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Status()
	r.Close()
	if st.Gens != m.Gens.String() || st.OutOfSync != 2*repl.ChunkSize || st.Disk != repl.UpToDate.String() {
		t.Fatalf("replica after the move: gens %s out of sync %d disk %s; want gens %s, %d bytes, %s",
			st.Gens, st.OutOfSync, st.Disk, m.Gens.String(), 2*repl.ChunkSize, repl.UpToDate.String())
	}
}

// TestMigrateBothLayouts: state in both places is refused, naming both,
// and neither is touched.
func TestMigrateBothLayouts(t *testing.T) {
	dataDir, set, _, _ := migDataDir(t)
	if err := SaveSettings(Dir(dataDir, "vm1"), set); err != nil {
		t.Fatal(err)
	}
	err := Migrate(dataDir, quietLog())
	if !errors.Is(err, ErrBothLayouts) || !strings.Contains(err.Error(), legacyDir(dataDir, "vm1")) || !strings.Contains(err.Error(), Dir(dataDir, "vm1")) {
		t.Fatalf("both layouts: %v", err)
	}
	for _, d := range []string{legacyDir(dataDir, "vm1"), Dir(dataDir, "vm1")} {
		if _, err := os.Stat(filepath.Join(d, "config.json")); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
	}
	// The daemon refuses to start replication rather than pick one.
	if _, err := NewPlugin(configFor(dataDir), quietLog()); !errors.Is(err, ErrBothLayouts) {
		t.Fatalf("NewPlugin with both layouts: %v", err)
	}
	// Configure, too (its settings would land beside one of them).
	if _, err := Configure(dataDir, "vm1", set); !errors.Is(err, ErrBothLayouts) {
		t.Fatalf("Configure with both layouts: %v", err)
	}
}

// TestMigrateOrphan: old-layout state of a volume that does not exist is
// left where it is (warned about), and does not stop the others moving.
func TestMigrateOrphan(t *testing.T) {
	dataDir, set, _, _ := migDataDir(t)
	if err := SaveSettings(legacyDir(dataDir, "gone"), set); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(dataDir, quietLog()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(legacyDir(dataDir, "gone"), "config.json")); err != nil {
		t.Fatalf("orphan state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(Dir(dataDir, "vm1"), "config.json")); err != nil {
		t.Fatalf("vm1 not moved: %v", err)
	}
}

// TestDeleteRemovesState: deleting a replicated volume (force, as the
// delete check requires) removes its replication state with its state
// directory; no hook is involved. A state directory left by a crash
// between the metadata's removal and the state's is removed by the next
// Create of that name, so a new volume never inherits replication.
func TestDeleteRemovesState(t *testing.T) {
	dataDir, _, _, _ := migDataDir(t)
	hooks := daemon.VolumeHooks{Delete: []daemon.DeleteCheck{DeleteCheck}}

	// Not yet moved: the delete is refused (the old directory would
	// survive the volume), naming it.
	ops, _, err := daemon.OpenVolumeOps(dataDir, hooks)
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.Delete("vm1", true); !errors.Is(err, volume.ErrInUse) || !strings.Contains(err.Error(), legacyDir(dataDir, "vm1")) {
		t.Fatalf("delete with old-layout state: %v", err)
	}
	ops.Close()
	if err := Migrate(dataDir, quietLog()); err != nil {
		t.Fatal(err)
	}

	ops, _, err = daemon.OpenVolumeOps(dataDir, hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	if err := ops.Delete("vm1", false); !errors.Is(err, volume.ErrInUse) || !strings.Contains(err.Error(), "replicated") {
		t.Fatalf("delete without force: %v", err)
	}
	if err := ops.Delete("vm1", true); err != nil {
		t.Fatal(err)
	}
	sd, _ := volume.StatePath(dataDir, "vm1")
	if _, err := os.Stat(sd); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state directory after delete: %v", err)
	}

	// Crash debris: state without a volume, then a new volume of that name.
	if err := SaveSettings(Dir(dataDir, "vm1"), Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2", NodeID: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Create(volume.CreateOptions{Name: "vm1", Size: migSize}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSettings(Dir(dataDir, "vm1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("new volume inherited replication settings: %v", err)
	}
}

func configFor(dataDir string) config.Config { return config.Config{DataDir: dataDir} }
