// Command plot draws the scenario scripts' time series: one line per series
// from a TSV file of "series<TAB>x<TAB>y" rows, written as a PNG.
//
//	go run ./scenarios/plot -title T -x X -y Y -o out.png data.tsv
//
// It lives beside the scripts (not in cmd/) because it is only their helper;
// it uses gonum/plot, which the module already depends on for `vmsan bench`
// plots, so the scenarios need no plotting package from the distribution.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	title := flag.String("title", "", "plot title")
	xl := flag.String("x", "x", "x axis label")
	yl := flag.String("y", "y", "y axis label")
	out := flag.String("o", "plot.png", "output PNG")
	logY := flag.Bool("logy", false, "logarithmic y axis (values <= 0 are dropped)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: plot [-title T] [-x X] [-y Y] [-logy] -o OUT.png DATA.tsv")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *out, *title, *xl, *yl, *logY); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(in, out, title, xl, yl string, logY bool) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	var order []string
	series := map[string]plotter.XYs{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) != 3 {
			continue // blank or comment lines
		}
		x, errx := strconv.ParseFloat(fs[1], 64)
		y, erry := strconv.ParseFloat(fs[2], 64)
		if errx != nil || erry != nil {
			return fmt.Errorf("%s:%d: want series<TAB>x<TAB>y, got %q", in, n, sc.Text())
		}
		if logY && y <= 0 {
			continue
		}
		if _, ok := series[fs[0]]; !ok {
			order = append(order, fs[0])
		}
		series[fs[0]] = append(series[fs[0]], plotter.XY{X: x, Y: y})
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(order) == 0 {
		return fmt.Errorf("%s: no data", in)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xl
	p.Y.Label.Text = yl
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{}
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	var args []any
	for _, s := range order {
		args = append(args, s, series[s])
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return p.Save(8*vg.Inch, 4.5*vg.Inch, out)
}
