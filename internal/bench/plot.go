package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Plot draws results into one .png or .svg file: a bar chart per profile
// (one bar per result for every row, in the row's headline unit) and, for
// gnome-disks results, the transfer rate versus position on the target.
// Panels are stacked vertically.
func Plot(path string, names []string, rs []*Result) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("bench: --plot wants a .png or .svg file name, got %q", path)
	}
	var panels []*plot.Plot
	twins := map[*plot.Plot]*twinAxis{}
	var profiles []string
	seen := map[string]bool{}
	for _, r := range rs {
		if !seen[r.Profile] {
			seen[r.Profile] = true
			profiles = append(profiles, r.Profile)
		}
	}
	for _, prof := range profiles {
		for _, unit := range []string{MetricMBps, MetricIOPS, MetricMs} {
			p, err := barPanel(prof, unit, names, rs)
			if err != nil {
				return err
			}
			if p != nil {
				panels = append(panels, p)
			}
		}
		if prof == ProfileGnome {
			p, ax, err := ratePanel(names, rs)
			if err != nil {
				return err
			}
			panels = append(panels, p)
			if ax != nil {
				twins[p] = ax
			}
		}
	}
	if len(panels) == 0 {
		return fmt.Errorf("bench: nothing to plot")
	}
	const w, h = 8 * vg.Inch, 4 * vg.Inch
	var c vg.CanvasWriterTo
	H := h * vg.Length(len(panels))
	if ext == ".svg" {
		c = vgsvg.New(w, H)
	} else {
		c = vgimg.PngCanvas{Canvas: vgimg.New(w, H)}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, draw.New(c))
	for i := range panels {
		if ax := twins[panels[i]]; ax != nil {
			// Leave room on the right for the second y axis.
			inner := draw.Crop(canvases[i][0], 0, -twinAxisWidth, 0, 0)
			panels[i].Draw(inner)
			ax.draw(panels[i], inner)
			continue
		}
		panels[i].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func barPanel(prof, unit string, names []string, rs []*Result) (*plot.Plot, error) {
	var keys []string
	seen := map[string]bool{}
	for _, r := range rs {
		if r.Profile != prof {
			continue
		}
		for _, o := range r.Ops {
			if _, u := o.Headline(); u == unit && !seen[o.Key()] {
				seen[o.Key()] = true
				keys = append(keys, o.Key())
			}
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("vmsan bench %s (%s)", prof, unitLabel(unit))
	p.Y.Label.Text = unitLabel(unit)
	p.Legend.Top = true
	var series []int
	for i, r := range rs {
		if r.Profile == prof {
			series = append(series, i)
		}
	}
	bw := vg.Points(40) / vg.Length(len(series))
	if len(keys) > 8 {
		bw = vg.Points(20) / vg.Length(len(series))
	}
	for j, i := range series {
		vals := make(plotter.Values, len(keys))
		for k, key := range keys {
			if o, ok := rs[i].Row(key); ok {
				vals[k], _ = o.Headline()
			}
		}
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			return nil, err
		}
		b.LineStyle.Width = 0
		b.Color = plotutil.Color(j)
		b.Offset = bw * vg.Length(j-len(series)/2)
		if len(series)%2 == 0 {
			b.Offset += bw / 2
		}
		p.Add(b)
		p.Legend.Add(names[i], b)
	}
	p.NominalX(keys...)
	p.X.Tick.Label.Rotation = 0.35
	p.X.Tick.Label.XAlign = draw.XRight
	return p, nil
}

func unitLabel(u string) string {
	switch u {
	case MetricMBps:
		return "MB/s (1 MB = 10^6 bytes)"
	case MetricMs:
		return "ms (lower is better)"
	}
	return u
}

// ratePanel is GNOME Disks' graph: over the position on the target (in
// percent, as GNOME Disks shows it, so targets of different sizes line
// up), the transfer rate as a line against the left axis and every
// access-time read as a dot against a second axis on the right (ms).
// gonum/plot has one y axis per plot, so the dots are drawn in rate
// coordinates scaled by twinAxis.scale and the returned twinAxis draws the
// right-hand axis in ms.
func ratePanel(names []string, rs []*Result) (*plot.Plot, *twinAxis, error) {
	p := plot.New()
	p.Title.Text = "gnome-disks: transfer rate (lines) and access time (dots)"
	p.X.Label.Text = "position on target (%)"
	p.Y.Label.Text = "transfer rate, MB/s (1 MB = 10^6 bytes)"
	p.Legend.Top = true
	maxRate, maxMs := 0.0, 0.0
	for _, r := range rs {
		if r.Profile != ProfileGnome || r.Gnome == nil {
			continue
		}
		for _, s := range r.Gnome.Samples {
			maxRate = math.Max(maxRate, math.Max(s.ReadMBps, s.WriteMBps))
		}
		for _, a := range r.Gnome.Access {
			maxMs = math.Max(maxMs, a.Ms)
		}
	}
	if !(maxRate > 0) || math.IsInf(maxRate, 0) {
		maxRate = 1
	}
	p.Y.Min, p.Y.Max = 0, maxRate*1.1
	p.X.Min, p.X.Max = 0, 100
	var ax *twinAxis
	if maxMs > 0 && !math.IsInf(maxMs, 0) {
		ax = &twinAxis{max: maxMs * 1.1, label: "access time, ms"}
		ax.scale = p.Y.Max / ax.max
	}
	pct := func(r *Result, off int64) float64 {
		if r.Target.Size <= 0 {
			return 0
		}
		return float64(off) / float64(r.Target.Size) * 100
	}
	c := 0
	for i, r := range rs {
		if r.Profile != ProfileGnome || r.Gnome == nil {
			continue
		}
		rd := make(plotter.XYs, len(r.Gnome.Samples))
		var wr plotter.XYs
		for k, s := range r.Gnome.Samples {
			rd[k] = plotter.XY{X: pct(r, s.Offset), Y: s.ReadMBps}
			if s.WriteMBps > 0 {
				wr = append(wr, plotter.XY{X: pct(r, s.Offset), Y: s.WriteMBps})
			}
		}
		l, err := plotter.NewLine(rd)
		if err != nil {
			return nil, nil, err
		}
		l.Color = plotutil.Color(c)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(names[i]+" read rate", l)
		if ax != nil && len(r.Gnome.Access) > 0 {
			pts := make(plotter.XYs, len(r.Gnome.Access))
			for k, a := range r.Gnome.Access {
				pts[k] = plotter.XY{X: pct(r, a.Offset), Y: a.Ms * ax.scale}
			}
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, nil, err
			}
			sc.GlyphStyle.Color = plotutil.Color(c)
			sc.GlyphStyle.Radius = vg.Points(1.2)
			sc.GlyphStyle.Shape = draw.CircleGlyph{}
			p.Add(sc)
			p.Legend.Add(names[i]+" access time", sc)
		}
		c++
		if len(wr) > 0 {
			lw, err := plotter.NewLine(wr)
			if err != nil {
				return nil, nil, err
			}
			lw.Color = plotutil.Color(c)
			lw.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			p.Add(lw)
			p.Legend.Add(names[i]+" write rate", lw)
			c++
		}
	}
	p.Add(plotter.NewGrid())
	return p, ax, nil
}

// twinAxisWidth is the room kept right of a panel for its second axis.
const twinAxisWidth = 18 * vg.Millimeter

// twinAxis is a second y axis on the right of a panel: values v are
// plotted at v*scale in the panel's own y coordinates.
type twinAxis struct {
	max, scale float64
	label      string
}

// draw draws the axis line, ticks, tick labels and the axis label just
// right of p's data area, which p.Draw(c) has laid out.
func (a *twinAxis) draw(p *plot.Plot, c draw.Canvas) {
	dc := p.DataCanvas(c)
	trX, trY := p.Transforms(&dc)
	x := trX(p.X.Max)
	ls := p.Y.LineStyle
	c.StrokeLine2(ls, x, trY(p.Y.Min), x, trY(p.Y.Max))
	tsty := p.Y.Tick.Label
	tsty.XAlign, tsty.YAlign = draw.XLeft, draw.YCenter
	tsty.Rotation = 0
	for _, t := range (plot.DefaultTicks{}).Ticks(0, a.max) {
		if t.Label == "" || t.Value > a.max {
			continue
		}
		y := trY(t.Value * a.scale)
		c.StrokeLine2(p.Y.Tick.LineStyle, x, y, x+vg.Points(4), y)
		c.FillText(tsty, vg.Point{X: x + vg.Points(6), Y: y}, t.Label)
	}
	lsty := p.Y.Label.TextStyle
	lsty.Rotation = -math.Pi / 2
	lsty.XAlign, lsty.YAlign = draw.XCenter, draw.YCenter
	mid := (trY(p.Y.Min) + trY(p.Y.Max)) / 2
	c.FillText(lsty, vg.Point{X: c.Max.X + twinAxisWidth - vg.Points(8), Y: mid}, a.label)
}
