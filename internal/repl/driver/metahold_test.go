package driver

import (
	"errors"
	"io/fs"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/vfs"
)

// failingFS fails the metadata operations that only (creates: a new
// descriptor) or every mutating one with the error it holds (nil: none).
func failingFS(cur *atomic.Pointer[error], only vfs.OpKind) vfs.FS {
	return vfs.Inject(vfs.OS, func(op vfs.Op) error {
		if e := cur.Load(); e != nil && (op.Kind == only || only == "" && op.Kind.Mutates()) {
			return &fs.PathError{Op: string(op.Kind), Path: op.Path, Err: *e}
		}
		return nil
	})
}

// A disconnected primary's write needs metadata writes (activity log,
// bitmap, generations). While they fail with a transient error (out of
// space: every write fails; out of descriptors: opening a new file
// fails, so the atomic replaces of bitmap and meta do, not the activity
// log's in-place write) replication keeps running with the failed step
// held and retried, and a write whose activity log entry is not durable
// is neither acknowledged nor failed; once metadata can be written the
// write is acknowledged and the pair resyncs. A real I/O error still
// stops replication (the write fails with EIO).
func TestMetadataWriteTransientErrorHolds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       syscall.Errno
		only      vfs.OpKind
		transient bool
	}{
		{"EMFILE", syscall.EMFILE, vfs.OpCreate, true},
		{"ENOSPC", syscall.ENOSPC, "", true},
		{"EIO", syscall.EIO, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, 16<<20, "C")
			var cur atomic.Pointer[error]
			a.stop()
			a.fs = failingFS(&cur, tc.only)
			a.start()
			waitFor(t, "connect", 10*time.Second, connected(a))
			if err := a.write(0, pattern(1, 64<<10)); err != nil {
				t.Fatal(err)
			}
			if err := b.r.Disconnect(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a notices", 10*time.Second, func() bool { return a.r.Status().Conn == "Connecting" })
			e := error(tc.err)
			cur.Store(&e)
			done := make(chan error, 1)
			go func() { done <- a.write(8<<20, pattern(7, 64<<10)) }()
			if !tc.transient {
				select {
				case err := <-done:
					if !errors.Is(err, syscall.EIO) {
						t.Fatalf("write after a metadata EIO: %v, want EIO", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("write not failed after a metadata EIO")
				}
				return
			}
			waitFor(t, "metadata write held", 10*time.Second, func() bool { return a.r.Status().MetadataHeld })
			if !a.r.Metrics().MetadataHeld {
				t.Error("metrics do not show the held metadata write")
			}
			if tc.only == "" {
				select {
				case err := <-done:
					t.Fatalf("write answered (%v) while its activity log write fails", err)
				case <-time.After(300 * time.Millisecond):
				}
			}
			cur.Store(nil)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("held write: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("held write not acknowledged after the error cleared")
			}
			waitFor(t, "held metadata written", 10*time.Second, func() bool { return !a.r.Status().MetadataHeld })
			if err := b.r.Connect(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "resync", 20*time.Second, func() bool { return connected(a)() && a.r.Status().OutOfSync == 0 })
			waitFor(t, "equal", 10*time.Second, func() bool { return a.sum() == b.sum() })
		})
	}
}
