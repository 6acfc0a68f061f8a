package driver

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/volume"
)

// legacyDir is where a volume's replication files lived before they moved
// into the volume's state directory (Dir): <data_dir>/repl/<volume>.
func legacyDir(dataDir, name string) string { return filepath.Join(dataDir, "repl", name) }

// ErrBothLayouts: a volume has replication state both in the old
// <data_dir>/repl/<volume> and in its state directory; which one the node
// last ran with is not known, so neither is used.
var ErrBothLayouts = errors.New("replication state exists in both the old and the new location")

// Migrate moves the replication state of every existing volume from the
// old layout (<data_dir>/repl/<volume>) to Dir, logging one line per
// volume. It runs at daemon start (NewPlugin) before anything reads the
// state, and is crash-safe: each volume is one rename(2) within the data
// directory, so after a crash the state is in exactly one of the two
// places and the next start finishes the job. A volume with state in both
// places is refused (ErrBothLayouts, naming both paths); state of a volume
// that does not exist is left where it is (a warning: remove it).
func Migrate(dataDir string, log *slog.Logger) error {
	ents, err := os.ReadDir(filepath.Join(dataDir, "repl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replication state: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if err := migrateVolume(dataDir, e.Name(), log); err != nil {
			errs = append(errs, err)
		}
	}
	// The old directory goes once it is empty (it stays while it holds
	// state of volumes that do not exist, so the warning keeps naming it).
	os.Remove(filepath.Join(dataDir, "repl"))
	return errors.Join(errs...)
}

// migrateVolume moves one volume's state (see Migrate). Nothing to move is
// not an error.
func migrateVolume(dataDir, name string, log *slog.Logger) error {
	if log == nil {
		log = slog.Default() // `vmsan repl configure`: stderr
	}
	old := legacyDir(dataDir, name)
	if _, err := os.Lstat(old); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	if _, err := volume.ReadMeta(dataDir, name); err != nil {
		if errors.Is(err, volume.ErrNotFound) || errors.Is(err, volume.ErrInvalidName) {
			log.Warn("replication state for a volume that does not exist; ignored (remove the directory)", "volume", name, "dir", old)
			return nil
		}
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	dst := Dir(dataDir, name)
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("replication of %s: %w: %s (old) and %s (new). Keep the one this node last ran with "+
			"(compare the modification times of their meta.json), remove the other, and start again",
			name, ErrBothLayouts, old, dst)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	parent := filepath.Dir(dst) // the volume's state directory
	if err := os.MkdirAll(parent, dirMode); err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	if err := os.Rename(old, dst); err != nil {
		return fmt.Errorf("replication of %s: move %s to %s: %w", name, old, dst, err)
	}
	// Make the rename durable in both directories before the state is used
	// from its new place: otherwise a crash could bring back the old
	// directory entry beside state already written in the new one.
	if err := atomicfile.SyncDir(parent); err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(old)); err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	log.Info("replication state moved into the volume's state directory", "volume", name, "from", old, "to", dst)
	return nil
}
