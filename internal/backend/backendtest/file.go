package backendtest

import (
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/testutil"
)

// NewFile creates a sparse raw file of size bytes in a disk-backed temp dir
// (testutil.DiskTempDir: O_DIRECT and hole punching need a real filesystem,
// not tmpfs) and opens it read-write with mode. It returns the open file and
// its path; t.Cleanup closes it (ignoring the error, so a test may close or
// reopen it itself).
func NewFile(t testing.TB, size int64, mode backend.CacheMode) (*backend.File, string) {
	t.Helper()
	p := filepath.Join(testutil.DiskTempDir(t), "vol.raw")
	if err := backend.CreateFile(p, size); err != nil {
		t.Fatal(err)
	}
	f, err := backend.OpenFile(p, mode, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, p
}
