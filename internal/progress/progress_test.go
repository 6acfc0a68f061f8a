package progress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentETA(t *testing.T) {
	for _, c := range []struct {
		done, total int64
		want        int
	}{{0, 100, 0}, {1, 3, 33}, {50, 100, 50}, {99, 100, 99}, {100, 100, 100}, {150, 100, 100}, {5, 0, 0}, {-1, 10, 0}} {
		if got := Percent(c.done, c.total); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.done, c.total, got, c.want)
		}
	}
	// A quarter done in 10 s: 30 s left at the same rate.
	if left, ok := ETA(25, 100, 10*time.Second); !ok || left != 30*time.Second {
		t.Errorf("ETA(25/100 in 10s) = %v %v, want 30s", left, ok)
	}
	for _, c := range []struct {
		done, total int64
		el          time.Duration
	}{{0, 100, time.Second}, {10, 0, time.Second}, {10, 100, 0}} {
		if _, ok := ETA(c.done, c.total, c.el); ok {
			t.Errorf("ETA(%d/%d in %v) claims to know", c.done, c.total, c.el)
		}
	}
	if left, ok := ETA(100, 100, time.Minute); !ok || left != 0 {
		t.Errorf("ETA when done = %v %v", left, ok)
	}
	for _, c := range []struct {
		d    time.Duration
		ok   bool
		want string
	}{{0, true, "0:00"}, {19 * time.Second, true, "0:19"}, {61500 * time.Millisecond, true, "1:02"}, {3723 * time.Second, true, "1:02:03"}, {0, false, "--:--"}} {
		if got := FormatETA(c.d, c.ok); got != c.want {
			t.Errorf("FormatETA(%v, %v) = %q, want %q", c.d, c.ok, got, c.want)
		}
	}
}

func TestLine(t *testing.T) {
	got := Line("import", 1<<30, 4<<30, 8*time.Second, Bytes)
	if want := "import: 25% (1.0 GiB of 4.0 GiB, 128.0 MiB/s), ETA 0:24"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if got, want := Line("seeks", 0, 8192, time.Second, Count), "seeks: 0% (0 of 8192), ETA --:--"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if got, want := Line("overall", 30000, 120000, 30*time.Second, Millis), "overall: 25% (30s of 2m0s), ETA 1:30"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}

// TestPlainLines: on a file (not a terminal) the bar is a line every
// LinePeriod with percent and ETA, and a final line.
func TestPlainLines(t *testing.T) {
	old := LinePeriod
	LinePeriod = 0
	defer func() { LinePeriod = old }()
	p := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	b := New(f, "export", 4<<20, Bytes)
	b.Set(1 << 20)
	b.Set(2 << 20)
	b.Done("")
	f.Close()
	out, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "export: 25% (1.0 MiB of 4.0 MiB, ") || !strings.Contains(lines[1], "50%") ||
		!strings.Contains(lines[1], "ETA ") || !strings.HasPrefix(lines[2], "export: done, 4.0 MiB in ") {
		t.Fatalf("plain progress:\n%s", out)
	}
	// Quiet: nothing, and no panic.
	q := New(nil, "x", 10, Count)
	q.Set(5)
	q.Done("")
}
