package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// synthetic builds a result with known byte counts so every number in every
// output format can be predicted.
func synthetic(profile string, bytesPerSec int64) *Result {
	r := &Result{Schema: 1, Tool: ToolName, Profile: profile, Started: time.Unix(1700000000, 0), Target: TargetInfo{URI: "x", Kind: "nbd", Size: 1 << 30}, Params: map[string]any{}}
	mk := func(name, dir string, bs, qd int) OpResult {
		o := OpResult{Name: name, Dir: dir, BS: bs, QD: qd, Jobs: 1, Bytes: bytesPerSec * 2, Ops: bytesPerSec * 2 / int64(bs), Seconds: 2, Metric: MetricMBps}
		o.fill(nil)
		return o
	}
	switch profile {
	case ProfileCDM:
		for _, d := range []string{"read", "write"} {
			r.Ops = append(r.Ops, mk("SEQ1M Q8T1", d, 1<<20, 8), mk("RND4K Q32T1", d, 4096, 32))
		}
	case ProfileBonnie:
		for _, n := range bonnieOrder {
			o := mk(n, dirOf(n), 8192, 1)
			if n == BonnieSeeks {
				o.Metric = MetricIOPS
			}
			r.Ops = append(r.Ops, o)
		}
		r.Params["size_bytes"] = int64(4 << 30)
		r.Params["chunk_bytes"] = 8192
		r.BonnieCS = BonnieCSV(r)
	default:
		r.Ops = append(r.Ops, mk("job", "read", 4096, 1))
	}
	return r
}

// TestUnitsPinned: 123,456,789 bytes/s must print as 123.457 MB/s (decimal)
// everywhere MB is used, as 117.74 MiB/s where MiB is used, and as
// 120563 K/sec (K = 1024) in the bonnie++ table and CSV.
func TestUnitsPinned(t *testing.T) {
	const bps = 123_456_789
	r := synthetic(ProfileCDM, bps)
	if o := r.Ops[0]; math.Abs(o.MBps-123.456789) > 1e-9 || math.Abs(o.MiBps-117.737568855) > 1e-6 {
		t.Fatalf("MBps=%v MiBps=%v", o.MBps, o.MiBps)
	}
	var b bytes.Buffer
	PrintTable(&b, r)
	if !strings.Contains(b.String(), "123.457 MB/s") || !strings.Contains(b.String(), "1,000,000") {
		t.Fatalf("cdm table does not pin decimal MB:\n%s", b.String())
	}
	js, _ := json.Marshal(r)
	if !bytes.Contains(js, []byte(`"mb_per_s":123.456789`)) || !bytes.Contains(js, []byte(`"mib_per_s":117.7375`)) {
		t.Fatalf("JSON units wrong: %s", js)
	}
	b.Reset()
	r.Profile = ProfileJob
	PrintTable(&b, r)
	if !strings.Contains(b.String(), "123.46") || !strings.Contains(b.String(), "117.74") || !strings.Contains(b.String(), "1 MiB = 1,048,576 bytes") {
		t.Fatalf("generic table units:\n%s", b.String())
	}
	br := synthetic(ProfileBonnie, bps)
	b.Reset()
	PrintTable(&b, br)
	if !strings.Contains(b.String(), "120563") || !strings.Contains(b.String(), "K = 1024") {
		t.Fatalf("bonnie table must use K=1024 (120563 K/sec):\n%s", b.String())
	}
	f := strings.Split(br.BonnieCS, ",")
	if len(f) != 48 {
		t.Fatalf("bonnie++ 1.97 CSV has 48 fields, got %d: %s", len(f), br.BonnieCS)
	}
	if f[0] != "1.97" || f[5] != "4G" || f[9] != "120563" {
		t.Fatalf("bonnie CSV fields: %q", f[:12])
	}
	b.Reset()
	Compare(&b, []string{"a", "b"}, []*Result{synthetic(ProfileCDM, bps), synthetic(ProfileCDM, bps*11/10)})
	if !strings.Contains(b.String(), "123.46") || !strings.Contains(b.String(), "+10.0%") || !strings.Contains(b.String(), "MB/s = 1,000,000") {
		t.Fatalf("compare:\n%s", b.String())
	}
}

func TestCompareJSONAndPlot(t *testing.T) {
	dir := t.TempDir()
	a, bb := synthetic(ProfileCDM, 100e6), synthetic(ProfileCDM, 80e6)
	g := synthetic(ProfileGnome, 50e6)
	g.Gnome = &GnomeResult{Samples: []GnomeSample{{0, 100, 50}, {1e9, 90, 40}, {2e9, 70, 30}},
		Access: []GnomeAccessPoint{{5e8, 0.2}, {1.5e9, 8.5}}}
	g.Target.Size = 3e9
	pa, pb, pg := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json"), filepath.Join(dir, "g.json")
	for p, r := range map[string]*Result{pa: a, pb: bb, pg: g} {
		if err := r.Save(p); err != nil {
			t.Fatal(err)
		}
	}
	rows := CompareRows([]string{"a", "b"}, []*Result{a, bb})
	if len(rows) != 4 || rows[0].Change[1] == nil || math.Abs(*rows[0].Change[1]+20) > 1e-9 {
		t.Fatalf("compare rows: %+v", rows[0])
	}
	png1 := filepath.Join(dir, "cmp.png")
	if err := CompareFiles([]string{pa, pb, pg}, png1, false, devNull(t)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(png1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("plot is not a PNG: %v", err)
	}
	// cdm MB/s panel, gnome MB/s panel, gnome rate-vs-position panel.
	if h := img.Bounds().Dy(); h < 3*img.Bounds().Dx()/3 {
		t.Fatalf("expected 3 stacked panels, image is %v", img.Bounds())
	}
	svg := filepath.Join(dir, "g.svg")
	if err := Plot(svg, []string{"g"}, []*Result{g}); err != nil {
		t.Fatal(err)
	}
	s, _ := os.ReadFile(svg)
	if !bytes.Contains(s, []byte("position on target")) {
		t.Fatal("gnome-disks plot lacks the position axis label")
	}
	// Like GNOME Disks: the access-time dots get their own axis (ms) on the
	// right of the shared position axis.
	if !bytes.Contains(s, []byte("access time, ms")) || !bytes.Contains(s, []byte("g access time")) {
		t.Fatal("gnome-disks plot lacks the access-time scatter and its axis")
	}
	if err := Plot(filepath.Join(dir, "x.gif"), []string{"g"}, []*Result{g}); err == nil {
		t.Fatal("want error for unsupported plot format")
	}
	if _, err := LoadResult(svg); err == nil {
		t.Fatal("LoadResult accepted a non-result file")
	}
}

func devNull(t *testing.T) *os.File {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func quickOpts(profile string) Options {
	return Options{Profile: profile, Passes: 1, PassTime: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Area: 8 << 20,
		BonnieSize: 8 << 20, ChrSize: 64 << 10, Seeks: 200, Samples: 5, SampleSize: 1 << 20, AccessReads: 50, WriteTest: true, Seed: 42,
		Job: JobSpec{RW: RandRW, BS: 4096, QD: 8, Runtime: 200 * time.Millisecond}}
}

func TestFileTargetSafety(t *testing.T) {
	ctx := context.Background()
	dir := testutil.DiskTempDir(t)
	// A directory: a scratch file is created inside and removed on Close.
	tg, err := OpenTarget(ctx, dir, TargetOptions{Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !tg.Info().Created || tg.Info().Filesystem == "" {
		t.Fatalf("info: %+v", tg.Info())
	}
	if _, err := RunProfile(ctx, tg, Options{Profile: ProfileJob, Job: JobSpec{RW: Write, BS: 65536, QD: 2}}, nil); err != nil {
		t.Fatal(err)
	}
	tg.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("scratch file left behind: %v", ents)
	}
	// An existing file with data: writes need --force.
	p := filepath.Join(dir, "data.img")
	os.WriteFile(p, bytes.Repeat([]byte("precious"), 1<<17), 0o644)
	tg, err = OpenTarget(ctx, p, TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = RunProfile(ctx, tg, quickOpts(ProfileCDM), nil)
	if !errors.Is(err, ErrNeedForce) {
		t.Fatalf("want ErrNeedForce writing over data, got %v", err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, bytes.Repeat([]byte("precious"), 1<<17)) {
		t.Fatal("refused benchmark still modified the file")
	}
	// Read-only mode runs the read rows on the existing data.
	o := quickOpts(ProfileCDM)
	o.ReadOnly = true
	res, err := RunProfile(ctx, tg, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Ops {
		if r.Dir != "read" {
			t.Fatalf("read-only run has a %s row", r.Dir)
		}
	}
	if res.Totals.BytesWritten != 0 {
		t.Fatalf("read-only run wrote %d bytes", res.Totals.BytesWritten)
	}
	tg.Close()
	// A file opened read-only cannot be written even with Force.
	tg, err = OpenTarget(ctx, p, TargetOptions{ReadOnly: true, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RunProfile(ctx, tg, Options{Profile: ProfileBonnie, Force: true}, nil); err == nil {
		t.Fatal("bonnie on a read-only target must fail")
	}
	tg.Close()
	// A missing file without --size is an error, not a zero-byte benchmark.
	if _, err := OpenTarget(ctx, filepath.Join(dir, "nope"), TargetOptions{}); err == nil {
		t.Fatal("want error for a missing file without size")
	}
}

// TestCacheFlag: a buffered read of a file smaller than RAM is flagged as
// served from cache, in the row, the notes and the table; the same read
// with O_DIRECT is not.
func TestCacheFlag(t *testing.T) {
	ctx := context.Background()
	dir := testutil.DiskTempDir(t)
	for _, direct := range []bool{false, true} {
		tg, err := OpenTarget(ctx, filepath.Join(dir, "c.img"), TargetOptions{Size: 16 << 20, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		res, err := RunProfile(ctx, tg, Options{Profile: ProfileJob, Job: JobSpec{RW: Read, BS: 1 << 20, QD: 2, Runtime: 100 * time.Millisecond}}, nil)
		tg.Close()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		PrintTable(&b, res)
		flagged := res.Ops[0].Cached && strings.Contains(b.String(), "served from cache")
		if flagged == direct {
			t.Fatalf("direct=%v: cached flag=%v, table:\n%s", direct, res.Ops[0].Cached, b.String())
		}
		// Buffered writes with no flush in the timing are flagged too.
		tg, err = OpenTarget(ctx, filepath.Join(dir, "c.img"), TargetOptions{Size: 16 << 20, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		res, err = RunProfile(ctx, tg, Options{Profile: ProfileJob, Job: JobSpec{RW: Write, BS: 1 << 20, QD: 2, Runtime: 100 * time.Millisecond}}, nil)
		tg.Close()
		if err != nil {
			t.Fatal(err)
		}
		if w := res.Ops[0]; w.Dir != "write" || w.Cached == direct || (!direct && w.Note != "absorbed by cache") {
			t.Fatalf("direct=%v: write row %+v", direct, w)
		}
	}
}

func TestRunnerCountsAndLatency(t *testing.T) {
	ctx := context.Background()
	tg, err := OpenTarget(ctx, filepath.Join(testutil.DiskTempDir(t), "r.img"), TargetOptions{Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	// One pass over the region: exactly size/bs requests, no more.
	m, err := Run(ctx, tg, JobSpec{Name: "t", RW: Write, BS: 4096, QD: 4, Jobs: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Writes.ops != 1024 || m.Writes.bytes != 4<<20 || m.Read.ops != 0 {
		t.Fatalf("ops=%d bytes=%d", m.Writes.ops, m.Writes.bytes)
	}
	r := m.Row("t", true)
	if r.Lat.P50Us <= 0 || r.Lat.P50Us > r.Lat.P99Us || r.Lat.P99Us > r.Lat.P999Us || r.Lat.P999Us > r.Lat.MaxUs*1.001 {
		t.Fatalf("latency percentiles not ordered: %+v", r.Lat)
	}
	// randrw with rwmix 75: about three reads per write.
	m, err = Run(ctx, tg, JobSpec{Name: "mix", RW: RandRW, BS: 4096, QD: 2, MaxOps: 4000, RWMix: 75, Seed: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tot := m.Read.ops + m.Writes.ops; tot != 4000 {
		t.Fatalf("MaxOps 4000, did %d", tot)
	}
	if frac := float64(m.Read.ops) / 4000; frac < 0.70 || frac > 0.80 {
		t.Fatalf("read fraction %.2f, want ~0.75", frac)
	}
	// Bad specs are errors, not panics.
	for _, s := range []JobSpec{{RW: Read, BS: 0}, {RW: Read, BS: 4096, Offset: 8 << 20}, {RW: Read, BS: 8 << 20},
		{RW: Read, BS: 1 << 40}, {RW: Read, BS: 4096, QD: 1 << 20}, {RW: Read, BS: 4096, QD: 64, Jobs: 1 << 10}} {
		if _, err := Run(ctx, tg, s, nil); err == nil {
			t.Errorf("spec %+v: want error", s)
		}
	}
}

// TestExecute drives the CLI logic end to end on a scratch file: JSON on
// stdout, the result file, the plot, and a too-large scratch file refused.
func TestExecute(t *testing.T) {
	dir := testutil.DiskTempDir(t)
	outPath := filepath.Join(dir, "stdout.json")
	stdout, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	res := filepath.Join(dir, "r.json")
	plot := filepath.Join(dir, "r.svg")
	cfg := RunConfig{Target: dir, Size: 8 << 20, JSON: true, Out: res, Plot: plot,
		Options: Options{Profile: ProfileGnome, Samples: 4, SampleSize: 1 << 20, AccessReads: 20, WriteTest: true}}
	if err := Execute(context.Background(), cfg, stdout, devNull(t)); err != nil {
		t.Fatal(err)
	}
	stdout.Close()
	b, _ := os.ReadFile(outPath)
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("stdout is not a JSON result: %v\n%s", err, b)
	}
	if r.Gnome == nil || len(r.Gnome.Samples) != 4 || r.Totals.BytesWritten == 0 || r.Env.Kernel == "" {
		t.Fatalf("result: %+v", r)
	}
	if _, err := LoadResult(res); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(plot); err != nil || st.Size() == 0 {
		t.Fatalf("plot not written: %v", err)
	}
	cfg = RunConfig{Target: dir, Size: 1 << 60, Out: "none", Options: Options{Profile: ProfileJob}}
	if err := Execute(context.Background(), cfg, devNull(t), devNull(t)); err == nil || !strings.Contains(err.Error(), "free") {
		t.Fatalf("a scratch file larger than the free space: want a clear error, got %v", err)
	}
}
