package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
)

// TestDaemonCDMAndBonnie is the issue's "done when" path: `vmsan bench
// --profile cdm nbd://127.0.0.1:PORT/default` against the daemon that
// `vmsan serve` runs (embedded defaults: a 10 GiB sparse volume "default"),
// printing the CrystalDiskMark table; then bonnie with --force over the
// data cdm left. The volume engine's byte counters must match the bench's.
func TestDaemonCDMAndBonnie(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	cfg.Listen = []string{"127.0.0.1:0"}
	d, err := daemon.New(cfg, daemon.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-runDone:
		case <-time.After(30 * time.Second):
			t.Error("daemon did not stop")
		}
	})
	port := d.NBDAddrs()[0].(*net.TCPAddr).Port
	uri := fmt.Sprintf("nbd://127.0.0.1:%d/default", port)

	run := func(o Options, size int64, open TargetOptions) (string, *Result) {
		t.Helper()
		dir := t.TempDir()
		out, err := os.Create(filepath.Join(dir, "stdout"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := RunConfig{Target: uri, Size: size, Out: filepath.Join(dir, "r.json"), Options: o, Open: open}
		if err := Execute(context.Background(), cfg, out, devNull(t)); err != nil {
			t.Fatal(err)
		}
		out.Close()
		b, _ := os.ReadFile(filepath.Join(dir, "stdout"))
		r, err := LoadResult(cfg.Out)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), r
	}
	table, r1 := run(Options{Profile: ProfileCDM, Passes: 1, PassTime: 200 * time.Millisecond, Warmup: 50 * time.Millisecond}, 16<<20, TargetOptions{Keep: true})
	for _, want := range []string{"[Read]", "[Write]", "SEQ    1MiB (Q=  8, T= 1):", "RND    4KiB (Q= 32, T= 1):", "MB/s"} {
		if !strings.Contains(table, want) {
			t.Fatalf("cdm table lacks %q:\n%s", want, table)
		}
	}
	if r1.Target.Size != 10<<30 || r1.Target.NBD == nil || r1.Target.NBD.Connections != 4 {
		t.Fatalf("target: %+v", r1.Target)
	}
	// A second write profile without --force is refused: cdm, run with
	// --keep, left its data (without --keep it punches it away).
	cfg2 := RunConfig{Target: uri, Size: 8 << 20, Out: "none", Options: Options{Profile: ProfileBonnie}}
	if err := Execute(context.Background(), cfg2, devNull(t), devNull(t)); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("bonnie over cdm's data without --force: %v", err)
	}
	table, r2 := run(Options{Profile: ProfileBonnie, ChrSize: 32 << 10, Seeks: 500}, 8<<20, TargetOptions{Force: true})
	if !strings.Contains(table, "--Sequential Output--") || !strings.Contains(table, "1.97,1.97,") {
		t.Fatalf("bonnie table:\n%s", table)
	}
	var engWritten, engRead uint64
	cl := daemon.NewClient(d.ControlPath())
	defer cl.Close()
	st, err := cl.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Name == "default" && v.Engine != nil {
			engWritten, engRead = v.Engine.BytesWritten, v.Engine.BytesRead
		}
	}
	wantW := uint64(r1.Totals.BytesWritten + r2.Totals.BytesWritten)
	wantR := uint64(r1.Totals.BytesRead + r2.Totals.BytesRead)
	// The refused bonnie run read the first MiB to find the data.
	wantR += 1 << 20
	if engWritten != wantW || engRead != wantR {
		t.Fatalf("volume engine: read %d written %d; bench: read %d written %d", engRead, engWritten, wantR, wantW)
	}
}
