package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotResults are a cdm result with a wide spread of values (4 KiB random
// rows 1000x below the sequential ones, one row served from the cache, one
// at 0), a second cdm result, and a gnome-disks result.
func plotResults() ([]string, []*Result) {
	a := synthetic(ProfileCDM, 2000e6)
	a.Ops[1].MBps = 1.5 // RND4K Q32T1 read
	a.Ops[0].Cached = true
	a.Ops[3].MBps = 0 // RND4K write: nothing measured
	b := synthetic(ProfileCDM, 900e6)
	g := synthetic(ProfileGnome, 50e6)
	g.Gnome = &GnomeResult{Samples: []GnomeSample{{0, 180, 50}, {1e9, 90, 40}, {2e9, 70, 30}},
		Access: []GnomeAccessPoint{{5e8, 0.2}, {1.5e9, 8.5}}}
	g.Target.Size = 3e9
	return []string{"first run", "second run", "gnome"}, []*Result{a, b, g}
}

// TestPlotLegendOffData: every panel's legend lies in its own strip above
// the data area: no legend entry is drawn over a bar, line or dot.
func TestPlotLegendOffData(t *testing.T) {
	names, rs := plotResults()
	for _, log := range []bool{false, true} {
		panels, err := buildPanels(names, rs, PlotOptions{LogScale: log})
		if err != nil {
			t.Fatal(err)
		}
		// cdm MB/s; the synthetic gnome-disks result's MB/s and its rate panel.
		if len(panels) != 3 {
			t.Fatalf("%d panels, want 3", len(panels))
		}
		c := draw.New(vgimg.New(8*vg.Inch, 4*vg.Inch*vg.Length(len(panels))))
		for i, dc := range panelCanvases(c, len(panels)) {
			pn := panels[i]
			titleC, legendC, plotC := pn.layout(dc)
			lr := pn.legend.Rectangle(legendC)
			data := pn.p.DataCanvas(plotC)
			if lr.Max.Y-lr.Min.Y <= 0 {
				t.Fatalf("panel %d (%s): empty legend", i, pn.title)
			}
			if lr.Min.Y < data.Max.Y {
				t.Errorf("panel %d (%s): legend [%v..%v] reaches into the data area (top %v)", i, pn.title, lr.Min.Y, lr.Max.Y, data.Max.Y)
			}
			if titleC.Min.Y < lr.Max.Y {
				t.Errorf("panel %d: title overlaps the legend", i)
			}
		}
	}
}

// TestPlotLogScale: with LogScale the bar panels' value axis is
// logarithmic with a labelled tick at every power of ten over the
// results' whole range (1.5 MB/s and 2000 MB/s in one chart), a zero row
// does not break it, and the figure renders.
func TestPlotLogScale(t *testing.T) {
	names, rs := plotResults()
	panels, err := buildPanels(names[:2], rs[:2], PlotOptions{LogScale: true})
	if err != nil {
		t.Fatal(err)
	}
	p := panels[0].p
	if p.Y.Min > 1.5 || p.Y.Max < 2000 || p.Y.Min <= 0 {
		t.Fatalf("log axis %v..%v does not cover 1.5..2000", p.Y.Min, p.Y.Max)
	}
	labels := map[string]bool{}
	minor := 0
	for _, tk := range p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max) {
		if tk.Label != "" {
			labels[tk.Label] = true
			if l := math.Log10(tk.Value); math.Abs(l-math.Round(l)) > 1e-9 {
				t.Errorf("labelled tick %v is not a power of ten", tk.Value)
			}
		} else {
			minor++
		}
	}
	for _, want := range []string{"1", "10", "100", "1k"} {
		if !labels[want] {
			t.Errorf("no tick labelled %s on the log axis (labels %v)", want, labels)
		}
	}
	if minor < 8 {
		t.Errorf("%d minor ticks on the log axis", minor)
	}
	// A linear axis has the same results at 1.5 MB/s invisible: 0..2300.
	lin, _ := buildPanels(names[:2], rs[:2], PlotOptions{})
	if lin[0].p.Y.Min != 0 {
		t.Errorf("linear axis starts at %v", lin[0].p.Y.Min)
	}
	dir := t.TempDir()
	for _, f := range []string{"log.png", "log.svg"} {
		if err := Plot(filepath.Join(dir, f), names, rs, PlotOptions{LogScale: true}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPlotValueLabelsAndCache: each bar has its value written above it,
// and a row served from the page cache is marked "*" as in the tables
// (and said so in the panel's title).
func TestPlotValueLabelsAndCache(t *testing.T) {
	names, rs := plotResults()
	svg := filepath.Join(t.TempDir(), "p.svg")
	if err := Plot(svg, names[:2], rs[:2]); err != nil {
		t.Fatal(err)
	}
	s, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">2000*<", ">1.50<", ">900<", ">0<", "served from the page cache", ">first run<", ">second run<"} {
		if !bytes.Contains(s, []byte(want)) {
			t.Errorf("plot lacks %q", want)
		}
	}
	for v, want := range map[float64]string{0: "0", 0.00416: "0.00416", 1.5: "1.50", 59.21: "59.2", 283.4: "283", 22868.2: "22868"} {
		if got := formatValue(v); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestGnomeAxes: the gnome-disks panel has percent ticks every 10% along
// the position, labelled rate ticks at a 1/2/5 step, and the access-time
// axis's labelled ticks on the same grid lines as the rate axis's; every
// series (read rate, write rate, access time) has its own colour.
func TestGnomeAxes(t *testing.T) {
	names, rs := plotResults()
	pn, err := ratePanel(names, rs)
	if err != nil {
		t.Fatal(err)
	}
	p := pn.p
	var xl []string
	for _, tk := range p.X.Tick.Marker.Ticks(p.X.Min, p.X.Max) {
		if tk.Label != "" {
			xl = append(xl, tk.Label)
		}
	}
	if len(xl) != 11 || xl[0] != "0%" || xl[5] != "50%" || xl[10] != "100%" {
		t.Errorf("position ticks %q", xl)
	}
	var left []float64
	for _, tk := range p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max) {
		if tk.Label != "" {
			left = append(left, tk.Value)
		}
	}
	if len(left) < 4 || left[0] != 0 || left[len(left)-1] != p.Y.Max || p.Y.Max < 180 {
		t.Errorf("rate ticks %v (axis max %v)", left, p.Y.Max)
	}
	if pn.twin == nil {
		t.Fatal("no access-time axis")
	}
	var right []float64
	for _, tk := range pn.twin.ticks() {
		if tk.Label != "" {
			right = append(right, tk.Value*pn.twin.scale)
		}
	}
	if len(right) != len(left) {
		t.Fatalf("access-time ticks at %v, rate ticks at %v: not on the same grid", right, left)
	}
	for i := range right {
		if math.Abs(right[i]-left[i]) > 1e-9*p.Y.Max {
			t.Fatalf("access-time ticks at %v, rate ticks at %v: not on the same grid", right, left)
		}
	}
	if pn.twin.max < 8.5 {
		t.Errorf("access-time axis to %v ms, the slowest read took 8.5", pn.twin.max)
	}
	// read rate, write rate, access time: three colours.
	seen := map[any]bool{}
	for i := 0; i < 3; i++ {
		seen[seriesColor(i)] = true
	}
	if len(seen) != 3 {
		t.Error("series colours repeat")
	}
}
