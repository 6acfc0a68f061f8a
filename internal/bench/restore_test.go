package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
	"github.com/vmsan/vmsan/internal/testutil"
)

const (
	restoreSize = 32 << 20
	userOff     = 16 << 20 // user data the benchmark finds (past the 1 MiB probe, so no --force)
	userLen     = 64 << 10
)

// seqWrite is a job that writes the whole target once: every hole gets
// allocated.
func seqWrite(target string, keep bool) RunConfig {
	return RunConfig{Target: target, Size: restoreSize, Out: "none", Quiet: true,
		Open:    TargetOptions{Keep: keep},
		Options: Options{Profile: ProfileJob, Job: JobSpec{RW: Write, BS: 1 << 20, QD: 2}}}
}

// allocated returns the byte ranges of f that hold data (SEEK_DATA map).
func fileAllocated(t *testing.T, path string) (data []Range, size int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	holes, err := fileHoles(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return subtract([]Range{{0, st.Size()}}, holes), st.Size()
}

// TestBenchRestoresFileHoles: a write run over an existing sparse file
// leaves its allocation as it found it (the user's 64 KiB, nothing else)
// and its size unchanged; with --keep the test data stays.
func TestBenchRestoresFileHoles(t *testing.T) {
	dir := testutil.DiskTempDir(t)
	for _, keep := range []bool{false, true} {
		p := filepath.Join(dir, "thin.img")
		os.Remove(p)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(restoreSize)
		f.WriteAt(bytes.Repeat([]byte{0xAB}, userLen), userOff)
		f.Sync()
		f.Close()
		before, _ := fileAllocated(t, p)
		if len(before) != 1 || before[0] != (Range{userOff, userLen}) {
			testutil.SkipOrFail(t, "filesystem under %s does not report holes (SEEK_DATA map %v)", dir, before)
		}
		if err := Execute(context.Background(), seqWrite(p, keep), devNull(t), devNull(t)); err != nil {
			t.Fatal(err)
		}
		after, size := fileAllocated(t, p)
		if size != restoreSize {
			t.Fatalf("keep=%v: size %d, want %d", keep, size, restoreSize)
		}
		if keep {
			if len(after) != 1 || after[0] != (Range{0, restoreSize}) {
				t.Fatalf("--keep: allocation %v, want all of it", after)
			}
			continue
		}
		if len(after) != 1 || after[0] != (Range{userOff, userLen}) {
			t.Fatalf("allocation after the run %v, want only the user's %v", after, before)
		}
	}
}

// TestBenchShrinksGrownFile: --force --size on a smaller file grows it for
// the run; afterwards it is back to its size.
func TestBenchShrinksGrownFile(t *testing.T) {
	p := filepath.Join(testutil.DiskTempDir(t), "small.img")
	if err := os.WriteFile(p, bytes.Repeat([]byte{1}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := seqWrite(p, false)
	cfg.Open.Force = true
	if err := Execute(context.Background(), cfg, devNull(t), devNull(t)); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Size() != 1<<20 {
		t.Fatalf("size %d after the run, want 1 MiB", st.Size())
	}
}

// TestBenchRestoresNBDHoles: the same over vmsan's NBD server, where the
// allocation is read with NBD_CMD_BLOCK_STATUS and undone with TRIM.
func TestBenchRestoresNBDHoles(t *testing.T) {
	dev := exporttest.NewFileDevice(t, "default", restoreSize, backend.CacheWriteback)
	_, sock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
	uri := "nbd+unix:///default?socket=" + sock
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, uri, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	allocated := func() []Range {
		t.Helper()
		var data []Range
		for off := int64(0); off < restoreSize; {
			ex, err := c.BlockStatus(off, restoreSize-off)
			if err != nil || len(ex) == 0 {
				t.Fatalf("block status: %v", err)
			}
			for _, e := range ex {
				if !e.Hole {
					if n := len(data); n > 0 && data[n-1].Off+data[n-1].Len == e.Offset {
						data[n-1].Len += e.Length
					} else {
						data = append(data, Range{e.Offset, e.Length})
					}
				}
				off = e.Offset + e.Length
			}
		}
		return data
	}
	if _, err := c.WriteAt(bytes.Repeat([]byte{0xAB}, userLen), userOff); err != nil {
		t.Fatal(err)
	}
	c.Flush()
	if a := allocated(); len(a) != 1 || a[0] != (Range{userOff, userLen}) {
		t.Fatalf("before: allocation %v", a)
	}
	cfg := seqWrite(uri, false)
	cfg.JSON = true
	out := filepath.Join(t.TempDir(), "r.json")
	cfg.Out = out
	if err := Execute(ctx, cfg, devNull(t), devNull(t)); err != nil {
		t.Fatal(err)
	}
	if a := allocated(); len(a) != 1 || a[0] != (Range{userOff, userLen}) {
		t.Fatalf("allocation after the run %v, want only the user's [%d,+%d)", a, userOff, userLen)
	}
	r, err := LoadResult(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(r.Notes, "\n"), "holes restored") {
		t.Fatalf("result notes %q lack the restoration", r.Notes)
	}
}

func TestSubtract(t *testing.T) {
	a := []Range{{0, 100}, {200, 100}}
	b := []Range{{10, 10}, {50, 160}, {290, 50}}
	got := subtract(a, b)
	want := []Range{{0, 10}, {20, 30}, {210, 80}}
	if len(got) != len(want) {
		t.Fatalf("got %v want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v want %v", got, want)
		}
	}
	if s := subtract(a, nil); len(s) != 2 || s[0] != a[0] || s[1] != a[1] {
		t.Fatalf("minus nothing: %v", s)
	}
}

// TestResultsDir: without -o the JSON goes under the results directory
// ($XDG_STATE_HOME/vmsan/bench by default), never into the working
// directory.
func TestResultsDir(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	if d := DefaultResultsDir(); d != filepath.Join(state, "vmsan", "bench") {
		t.Fatalf("DefaultResultsDir %q", d)
	}
	cwd := t.TempDir()
	t.Chdir(cwd)
	cfg := seqWrite(filepath.Join(t.TempDir(), "scratch.img"), false)
	cfg.Out = ""
	if err := Execute(context.Background(), cfg, devNull(t), devNull(t)); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
		t.Fatalf("bench wrote into the working directory: %v", ents)
	}
	got, _ := filepath.Glob(filepath.Join(state, "vmsan", "bench", "vmsan-bench-job-*.json"))
	if len(got) != 1 {
		t.Fatalf("results in the state dir: %v", got)
	}
	// --results-dir overrides.
	cfg.ResultsDir = filepath.Join(t.TempDir(), "mine")
	if err := Execute(context.Background(), cfg, devNull(t), devNull(t)); err != nil {
		t.Fatal(err)
	}
	if got, _ := filepath.Glob(filepath.Join(cfg.ResultsDir, "*.json")); len(got) != 1 {
		t.Fatalf("results in --results-dir: %v", got)
	}
}
