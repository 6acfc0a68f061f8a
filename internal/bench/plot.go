package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// PlotOptions change how results are drawn.
type PlotOptions struct {
	// LogScale draws the bar charts' value axis logarithmically, so that
	// small results (4 KiB random rates, bonnie's per-char rows) next to
	// large ones (sequential MB/s) stay visible.
	LogScale bool
}

// panel is one chart of the figure: the plot, its legend (drawn in a
// strip above the plot, never over the data) and, for gnome-disks, the
// second y axis.
type panel struct {
	p      *plot.Plot
	title  string // drawn above the legend (the plot's own title is empty)
	legend plot.Legend
	twin   *twinAxis
}

func newPanel() *panel {
	pn := &panel{p: plot.New(), legend: plot.NewLegend()}
	pn.legend.Top = true
	pn.legend.Left = true
	pn.legend.Padding = vg.Points(1.5)
	return pn
}

// legendPad is the room between the legend strip and the plot below it.
const legendPad = 2 * vg.Millimeter

// layout splits a panel's canvas into the title's line at the top, the
// legend's strip below it (as tall as the legend's entries) and the
// plot's canvas below that.
// INVARIANT: the parts do not overlap, so the legend never covers data.
func (pn *panel) layout(c draw.Canvas) (titleC, legendC, plotC draw.Canvas) {
	th := pn.p.Title.TextStyle.Height(pn.title) + legendPad
	r := pn.legend.Rectangle(c)
	lh := r.Max.Y - r.Min.Y
	if lh > 0 {
		lh += legendPad
	}
	full := c.Max.Y - c.Min.Y
	titleC = draw.Crop(c, 0, 0, full-th, 0)
	legendC = draw.Crop(c, 0, 0, full-th-lh, -th)
	plotC = draw.Crop(c, 0, 0, 0, -(th + lh))
	// Indent the legend to the data area's left edge (past the y axis).
	legendC.Min.X = pn.p.DataCanvas(plotC).Min.X
	return titleC, legendC, plotC
}

func (pn *panel) draw(c draw.Canvas) {
	titleC, legendC, plotC := pn.layout(c)
	ts := pn.p.Title.TextStyle
	ts.XAlign, ts.YAlign = draw.XCenter, draw.YTop
	titleC.FillText(ts, vg.Point{X: (titleC.Min.X + titleC.Max.X) / 2, Y: titleC.Max.Y}, pn.title)
	if pn.twin != nil {
		// Leave room on the right for the second y axis.
		plotC = draw.Crop(plotC, 0, -twinAxisWidth, 0, 0)
	}
	pn.p.Draw(plotC)
	if pn.twin != nil {
		pn.twin.draw(pn.p, plotC)
	}
	pn.legend.Draw(legendC)
}

// palette is distinct, print-friendly colours (the Tango palette's dark
// shades): one per series, so a result's read rate, write rate and access
// times are told apart as GNOME Disks draws them.
var palette = []color.RGBA{
	{0x34, 0x65, 0xa4, 0xff}, // blue
	{0xcc, 0x00, 0x00, 0xff}, // red
	{0x4e, 0x9a, 0x06, 0xff}, // green
	{0xf5, 0x79, 0x00, 0xff}, // orange
	{0x75, 0x50, 0x7b, 0xff}, // purple
	{0xc4, 0xa0, 0x00, 0xff}, // dark yellow
	{0x06, 0x98, 0x9a, 0xff}, // teal
	{0x55, 0x57, 0x53, 0xff}, // grey
}

func seriesColor(i int) color.RGBA { return palette[i%len(palette)] }

// Plot draws results into one .png or .svg file: a bar chart per profile
// and unit (one bar per result for every row, in the row's headline unit,
// with its value written above it; rows that measured the page cache are
// pale and marked "*", as in the tables) and, for gnome-disks results, the
// transfer rate versus position on the target with the access times.
// Panels are stacked vertically.
func Plot(path string, names []string, rs []*Result, opts ...PlotOptions) error {
	var o PlotOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("bench: --plot wants a .png or .svg file name, got %q", path)
	}
	panels, err := buildPanels(names, rs, o)
	if err != nil {
		return err
	}
	const w, h = 8 * vg.Inch, 4 * vg.Inch
	var c vg.CanvasWriterTo
	H := h * vg.Length(len(panels))
	if ext == ".svg" {
		c = vgsvg.New(w, H)
	} else {
		c = vgimg.PngCanvas{Canvas: vgimg.New(w, H)}
	}
	for i, dc := range panelCanvases(draw.New(c), len(panels)) {
		panels[i].draw(dc)
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

// panelCanvases splits c into n stacked panels, top first.
func panelCanvases(c draw.Canvas, n int) []draw.Canvas {
	tiles := draw.Tiles{Rows: n, Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	out := make([]draw.Canvas, n)
	for i := range out {
		out[i] = tiles.At(c, 0, i)
	}
	return out
}

func buildPanels(names []string, rs []*Result, o PlotOptions) ([]*panel, error) {
	var panels []*panel
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
			pn := barPanel(prof, unit, names, rs, o)
			if pn != nil {
				panels = append(panels, pn)
			}
		}
		if prof == ProfileGnome {
			pn, err := ratePanel(names, rs)
			if err != nil {
				return nil, err
			}
			panels = append(panels, pn)
		}
	}
	if len(panels) == 0 {
		return nil, fmt.Errorf("bench: nothing to plot")
	}
	return panels, nil
}

func barPanel(prof, unit string, names []string, rs []*Result, o PlotOptions) *panel {
	var keys []string
	seen := map[string]bool{}
	for _, r := range rs {
		if r.Profile != prof {
			continue
		}
		for _, op := range r.Ops {
			if _, u := op.Headline(); u == unit && !seen[op.Key()] {
				seen[op.Key()] = true
				keys = append(keys, op.Key())
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	pn := newPanel()
	p := pn.p
	pn.title = fmt.Sprintf("vmsan bench %s: %s", prof, unitLabel(unit))
	// Short: a long rotated label shrinks the data area (gonum pads for it).
	p.Y.Label.Text = unit
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
	maxV, minPos, anyCached := 0.0, math.Inf(1), false
	var all []*bars
	for j, i := range series {
		b := &bars{width: bw, color: seriesColor(j), vals: make([]float64, len(keys)), cached: make([]bool, len(keys)), has: make([]bool, len(keys)), log: o.LogScale}
		for k, key := range keys {
			if op, ok := rs[i].Row(key); ok {
				v, _ := op.Headline()
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					v = 0
				}
				b.vals[k], b.cached[k], b.has[k] = v, op.Cached, true
				anyCached = anyCached || op.Cached
				maxV = math.Max(maxV, v)
				if v > 0 {
					minPos = math.Min(minPos, v)
				}
			}
		}
		b.offset = bw * vg.Length(j-len(series)/2)
		if len(series)%2 == 0 {
			b.offset += bw / 2
		}
		all = append(all, b)
		p.Add(b)
		pn.legend.Add(names[i], b)
	}
	if anyCached {
		pn.title += "; pale bars, *: served from the page cache"
	}
	if maxV <= 0 {
		maxV = 1
	}
	if o.LogScale {
		if math.IsInf(minPos, 1) {
			minPos = maxV
		}
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(minPos)))
		// A decade above the largest bar at least, and room for its label.
		p.Y.Max = math.Max(math.Pow(10, math.Ceil(math.Log10(maxV*3))), p.Y.Min*10)
		p.Y.Label.Text += " (log scale)"
	} else {
		p.Y.Min = 0
		p.Y.Max = maxV * 1.15 // room for the value labels
		p.Y.Tick.Marker = niceTicks{}
	}
	for _, b := range all {
		b.ymin = p.Y.Min
		b.ymax = p.Y.Max
	}
	p.Add(plotter.NewGrid())
	p.NominalX(keys...)
	p.X.Tick.Label.Rotation = 0.35
	p.X.Tick.Label.XAlign = draw.XRight
	return pn
}

// bars is one result's bar series: drawn from the axis bottom (0, or the
// lower end of a log axis) to each value, the value written above it
// ("*" after it, and a pale fill, for a row served from the page cache).
// A zero value has no bar on a log axis, only its label "0".
type bars struct {
	vals       []float64
	cached     []bool
	has        []bool // the result has this row (no bar, no label otherwise)
	width      vg.Length
	offset     vg.Length
	color      color.RGBA
	log        bool
	ymin, ymax float64 // the axis range (set once the panel's range is known)
}

func (b *bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	sty := p.Y.Tick.Label
	sty.Font.Size = vg.Points(7)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YBottom
	sty.Rotation = 0
	for k, v := range b.vals {
		if !b.has[k] {
			continue
		}
		x := trX(float64(k)) + b.offset
		y0 := trY(p.Y.Min)
		top := y0
		if v > 0 {
			top = trY(math.Min(v, p.Y.Max))
			var fill color.Color = b.color
			if b.cached[k] {
				fill = color.NRGBA{R: b.color.R, G: b.color.G, B: b.color.B, A: 0x60}
			}
			pts := []vg.Point{{X: x - b.width/2, Y: y0}, {X: x - b.width/2, Y: top}, {X: x + b.width/2, Y: top}, {X: x + b.width/2, Y: y0}}
			c.FillPolygon(fill, c.ClipPolygonY(pts))
			if b.cached[k] {
				ls := draw.LineStyle{Color: b.color, Width: vg.Points(0.8)}
				c.StrokeLines(ls, c.ClipLinesY(append(pts, pts[0]))...)
			}
		}
		label := formatValue(v)
		if b.cached[k] {
			label += "*"
		}
		ls := sty
		if sty.Rectangle(label).Max.X > b.width+vg.Points(2) {
			// Narrow bars: the label stands upright above the bar.
			ls.Rotation = math.Pi / 2
			ls.XAlign, ls.YAlign = draw.XLeft, draw.YCenter
		}
		c.FillText(ls, vg.Point{X: x, Y: top + vg.Points(2)}, label)
	}
}

func (b *bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmax = float64(len(b.vals) - 1)
	ymin, ymax = math.Inf(1), 0
	for _, v := range b.vals {
		if v > 0 {
			ymin = math.Min(ymin, v)
		}
		ymax = math.Max(ymax, v)
	}
	if !b.log || math.IsInf(ymin, 1) {
		ymin = 0
	}
	return 0, xmax, ymin, ymax
}

// GlyphBoxes keeps the outermost bars inside the data area.
func (b *bars) GlyphBoxes(p *plot.Plot) []plot.GlyphBox {
	out := make([]plot.GlyphBox, len(b.vals))
	for k := range b.vals {
		out[k].X = p.X.Norm(float64(k))
		out[k].Y = 0
		out[k].Rectangle = vg.Rectangle{Min: vg.Point{X: b.offset - b.width/2}, Max: vg.Point{X: b.offset + b.width/2}}
	}
	return out
}

func (b *bars) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}}
	c.FillPolygon(b.color, c.ClipPolygonY(pts))
}

// formatValue writes a bar's value with three significant digits.
func formatValue(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// niceStep is the 1, 2 or 5 × 10^k step that divides span into about n
// parts.
func niceStep(span float64, n int) float64 {
	if !(span > 0) || n < 1 {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

// niceTicks are labelled ticks at a 1/2/5 step (about five of them) with
// four minor ticks between, on a linear axis.
type niceTicks struct{ Suffix string }

func (t niceTicks) Ticks(min, max float64) []plot.Tick {
	step := niceStep(max-min, 5)
	return stepTicks(min, max, step, t.Suffix)
}

func stepTicks(min, max, step float64, suffix string) []plot.Tick {
	var ts []plot.Tick
	minor := step / 5
	first := math.Ceil(min/minor-1e-9) * minor
	for i := 0; ; i++ {
		v := first + float64(i)*minor
		if v > max+minor*1e-6 || i > 1000 {
			break
		}
		t := plot.Tick{Value: v}
		if r := math.Abs(v/step - math.Round(v/step)); r < 1e-6 {
			t.Label = strconv.FormatFloat(math.Round(v/step)*step, 'f', -1, 64) + suffix
		}
		ts = append(ts, t)
	}
	return ts
}

// logTicks label each power of ten (1, 10, 100, ... with k/M for
// thousands and millions) and put minor ticks at 2..9 × 10^k.
type logTicks struct{}

func (logTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		d := math.Pow(10, e)
		for m := 1.0; m < 10; m++ {
			v := m * d
			if v < min*(1-1e-9) || v > max*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 {
				t.Label = siLabel(v)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

func siLabel(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
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

// gnomeDivisions is the number of major divisions of the gnome-disks
// panel's y axes: both axes have their labelled ticks on the same grid
// lines.
const gnomeDivisions = 5

// ratePanel is GNOME Disks' graph: over the position on the target (in
// percent, as GNOME Disks shows it, so targets of different sizes line
// up), the transfer rate as a line against the left axis and every
// access-time read as a dot against a second axis on the right (ms).
// gonum/plot has one y axis per plot, so the dots are drawn in rate
// coordinates scaled by twinAxis.scale and the panel's twinAxis draws the
// right-hand axis in ms, with its ticks on the left axis's grid lines.
func ratePanel(names []string, rs []*Result) (*panel, error) {
	pn := newPanel()
	p := pn.p
	pn.title = "gnome-disks: transfer rate (lines) and access time (dots)"
	p.X.Label.Text = "position on target"
	p.Y.Label.Text = "transfer rate, MB/s (1 MB = 10^6 bytes)"
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
	step := niceStep(maxRate*1.05, gnomeDivisions)
	n := math.Ceil(maxRate * 1.05 / step)
	p.Y.Min, p.Y.Max = 0, n*step
	p.Y.Tick.Marker = tickAt{step: step}
	p.X.Min, p.X.Max = 0, 100
	p.X.Tick.Marker = tickAt{step: 10, suffix: "%"}
	if maxMs > 0 && !math.IsInf(maxMs, 0) {
		ms := niceStep(maxMs*1.05/n, 1)
		for ms*n < maxMs*1.05 {
			ms = niceStep(ms*1.5, 1)
		}
		pn.twin = &twinAxis{max: ms * n, step: ms, label: "access time, ms"}
		pn.twin.scale = p.Y.Max / pn.twin.max
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
			return nil, err
		}
		l.Color = seriesColor(c)
		l.Width = vg.Points(1.5)
		c++
		p.Add(l)
		pn.legend.Add(names[i]+" read rate", l)
		if len(wr) > 0 {
			lw, err := plotter.NewLine(wr)
			if err != nil {
				return nil, err
			}
			lw.Color = seriesColor(c)
			lw.Width = vg.Points(1.5)
			lw.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			c++
			p.Add(lw)
			pn.legend.Add(names[i]+" write rate", lw)
		}
		if pn.twin != nil && len(r.Gnome.Access) > 0 {
			pts := make(plotter.XYs, len(r.Gnome.Access))
			for k, a := range r.Gnome.Access {
				pts[k] = plotter.XY{X: pct(r, a.Offset), Y: math.Min(a.Ms*pn.twin.scale, p.Y.Max)}
			}
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, err
			}
			sc.GlyphStyle.Color = seriesColor(c)
			sc.GlyphStyle.Radius = vg.Points(1.2)
			sc.GlyphStyle.Shape = draw.CircleGlyph{}
			c++
			p.Add(sc)
			pn.legend.Add(names[i]+" access time (right axis)", sc)
		}
	}
	p.Add(plotter.NewGrid())
	return pn, nil
}

// tickAt puts labelled ticks every step (with suffix) and four minor
// ticks between.
type tickAt struct {
	step   float64
	suffix string
}

func (t tickAt) Ticks(min, max float64) []plot.Tick { return stepTicks(min, max, t.step, t.suffix) }

// twinAxisWidth is the room kept right of a panel for its second axis.
const twinAxisWidth = 18 * vg.Millimeter

// twinAxis is a second y axis on the right of a panel: values v are
// plotted at v*scale in the panel's own y coordinates; its labelled ticks
// are every step, on the left axis's grid lines.
type twinAxis struct {
	max, scale, step float64
	label            string
}

// ticks are the axis's ticks in its own unit.
func (a *twinAxis) ticks() []plot.Tick { return stepTicks(0, a.max, a.step, "") }

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
	for _, t := range a.ticks() {
		y := trY(t.Value * a.scale)
		tl := vg.Points(2)
		if t.Label != "" {
			tl = vg.Points(4)
			c.FillText(tsty, vg.Point{X: x + vg.Points(6), Y: y}, t.Label)
		}
		c.StrokeLine2(p.Y.Tick.LineStyle, x, y, x+tl, y)
	}
	lsty := p.Y.Label.TextStyle
	lsty.Rotation = -math.Pi / 2
	lsty.XAlign, lsty.YAlign = draw.XCenter, draw.YCenter
	mid := (trY(p.Y.Min) + trY(p.Y.Max)) / 2
	c.FillText(lsty, vg.Point{X: c.Max.X + twinAxisWidth - vg.Points(8), Y: mid}, a.label)
}
