package bench

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// TestProgramsSmoke runs every benchmark program once in a tiny
// configuration (64 MiB, 1 s cells, a few jobs) against a freshly built
// vmsan and requires each to exit 0 with every cell measured: a cell that
// failed (a server that did not start, a replica pair that did not
// connect, a client whose output no longer parses) fails the test. The
// figures themselves are not compared.
func TestProgramsSmoke(t *testing.T) {
	for _, tool := range []string{"fio", "nbdinfo", "nbdkit", "qemu-nbd", "nbd-server", "qemu-img", "iscsi-perf", "tgtd", "jq"} {
		testutil.NeedTool(t, tool)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	vmsan, cleanup, err := testutil.BuildVmsan()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	bin := t.TempDir()
	build := func(t *testing.T, prog string) string {
		t.Helper()
		out := filepath.Join(bin, prog)
		cmd := exec.Command("go", "build", "-o", out, "./bench/"+prog)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./bench/%s: %v\n%s", prog, err, b)
		}
		return out
	}
	// run runs a program from the repository root and returns its stdout;
	// a non-zero exit fails the test with the end of its stderr.
	run := func(t *testing.T, name string, args ...string) []byte {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		t.Logf("%s: %v", filepath.Base(name), time.Since(start).Round(100*time.Millisecond))
		if err != nil {
			e := stderr.Bytes()
			if len(e) > 4000 {
				e = e[len(e)-4000:]
			}
			t.Fatalf("%s %q: %v\nstderr:\n%s", filepath.Base(name), args, err, e)
		}
		return stdout.Bytes()
	}
	type cell struct {
		Job    string  `json:"job"`
		Server string  `json:"server"`
		Config string  `json:"config"`
		MBps   float64 `json:"mb_per_s"`
		IOPS   float64 `json:"iops"`
		NA     string  `json:"na"`
		Error  string  `json:"error"`
	}
	// measured checks that every cell that could run has a figure.
	measured := func(t *testing.T, cells []cell, want int) {
		t.Helper()
		if len(cells) != want {
			t.Fatalf("%d cells, want %d: %+v", len(cells), want, cells)
		}
		for _, c := range cells {
			if c.NA == "" && (c.Error != "" || c.IOPS <= 0 || c.MBps <= 0) {
				t.Fatalf("cell %+v not measured", c)
			}
		}
	}

	t.Run("nbd-compare", func(t *testing.T) {
		out := run(t, build(t, "nbd-compare"), "-vmsan", vmsan, "-dir", testutil.DiskTempDir(t), "-size", "64M",
			"-runtime", "1s", "-ramp", "0", "-jobs", "seq-read-1M-QD8,rand-write-4K-QD32", "-json")
		var rep struct{ Results []cell }
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("report: %v\n%s", err, out)
		}
		measured(t, rep.Results, 2*4)
	})
	t.Run("iscsi-compare", func(t *testing.T) {
		testutil.NeedRoot(t, "tgtd")
		out := run(t, build(t, "iscsi-compare"), "-vmsan", vmsan, "-dir", testutil.DiskTempDir(t), "-size", "64M", "-runtime", "1s",
			"-jobs", "qemu-img write 4K QD32,iscsi-perf randread 4K QD32,vmsan-bench randwrite 4K QD32", "-json")
		var rep struct{ Results []cell }
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("report: %v\n%s", err, out)
		}
		measured(t, rep.Results, 3*4)
		for _, c := range rep.Results {
			if c.Server == "vmsan" && c.NA != "" {
				t.Fatalf("vmsan's iSCSI target not measured: %+v", c)
			}
		}
	})
	t.Run("repl-compare", func(t *testing.T) {
		out := run(t, build(t, "repl-compare"), "-vmsan", vmsan, "-size", "64M", "-runtime", "1s", "-json")
		var cells []cell
		if err := json.Unmarshal(out, &cells); err != nil {
			t.Fatalf("report: %v\n%s", err, out)
		}
		measured(t, cells, 2*3)
	})
	t.Run("gather-load", func(t *testing.T) {
		out := run(t, "bash", "bench/gather-load/run.sh", vmsan, "0", "1", "16M", "smoke")
		m := regexp.MustCompile(`iops=(\d+) primary_mean_KiB=\[[0-9,]+\] secondary_mean_KiB=\[[0-9,]+\]`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("gather-load printed %q", out)
		}
		if n, _ := strconv.Atoi(string(m[1])); n <= 0 {
			t.Fatalf("gather-load: iops %d", n)
		}
	})
}
