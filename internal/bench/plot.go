package bench

import (
	"fmt"
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
			p, err := ratePanel(names, rs)
			if err != nil {
				return err
			}
			panels = append(panels, p)
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

// ratePanel is GNOME Disks' graph: rate against position on the target.
func ratePanel(names []string, rs []*Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "gnome-disks: transfer rate vs position"
	p.X.Label.Text = "position on target (GB, 1 GB = 10^9 bytes)"
	p.Y.Label.Text = "MB/s (1 MB = 10^6 bytes)"
	p.Legend.Top = true
	c := 0
	for i, r := range rs {
		if r.Profile != ProfileGnome || r.Gnome == nil {
			continue
		}
		rd := make(plotter.XYs, len(r.Gnome.Samples))
		var wr plotter.XYs
		for k, s := range r.Gnome.Samples {
			rd[k] = plotter.XY{X: float64(s.Offset) / 1e9, Y: s.ReadMBps}
			if s.WriteMBps > 0 {
				wr = append(wr, plotter.XY{X: float64(s.Offset) / 1e9, Y: s.WriteMBps})
			}
		}
		l, err := plotter.NewLine(rd)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(c)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(names[i]+" read", l)
		c++
		if len(wr) > 0 {
			lw, err := plotter.NewLine(wr)
			if err != nil {
				return nil, err
			}
			lw.Color = plotutil.Color(c)
			lw.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			p.Add(lw)
			p.Legend.Add(names[i]+" write", lw)
			c++
		}
	}
	p.Add(plotter.NewGrid())
	p.Y.Min = 0
	return p, nil
}
