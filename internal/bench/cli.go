package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RunConfig is everything `vmsan bench` takes from its command line.
type RunConfig struct {
	Target  string
	Open    TargetOptions
	Options Options
	// SizeSet says --size was given (it then sets the profile's test size).
	Size int64
	JSON bool   // print the JSON result to stdout instead of the table
	Out  string // result file: "" = auto name in ResultsDir, "none" = no file
	// ResultsDir holds auto-named results; "" = DefaultResultsDir().
	ResultsDir string
	Plot       string // .png or .svg to draw
	PlotOpts   PlotOptions
	Quiet      bool // no progress output
}

// DefaultResultsDir is where results go without -o: $XDG_STATE_HOME/vmsan/bench,
// i.e. ~/.local/state/vmsan/bench by default. One place, whatever the
// working directory, so runs accumulate where `vmsan bench compare` users
// look for them and no JSON litters the directory bench was started in.
// Without a home directory (a bare service environment) it is
// ./vmsan-results.
func DefaultResultsDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "vmsan", "bench")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		return filepath.Join(h, ".local", "state", "vmsan", "bench")
	}
	return "vmsan-results"
}

// DefaultScratchSize is the size of a scratch file created for a profile
// when --size is not given.
func DefaultScratchSize(profile string) int64 {
	switch profile {
	case ProfileBonnie:
		return BonnieDefaultSize()
	}
	return 1 << 30
}

// Execute opens the target, runs the profile, prints the table (or JSON),
// saves the result and draws the plot. stdout gets the report, stderr the
// progress.
func Execute(ctx context.Context, cfg RunConfig, stdout, stderr *os.File) error {
	o := cfg.Options
	if cfg.Size > 0 {
		switch o.Profile {
		case ProfileCDM, ProfileCDMLegacy:
			o.Area = cfg.Size
		case ProfileBonnie:
			o.BonnieSize = cfg.Size
		case ProfileJob:
			o.Job.Size = cfg.Size
		}
	}
	open := cfg.Open
	open.ReadOnly = open.ReadOnly || o.ReadOnly
	o.ReadOnly = open.ReadOnly
	o.Force = o.Force || open.Force
	if open.Size <= 0 {
		open.Size = cfg.Size
		if open.Size <= 0 {
			open.Size = DefaultScratchSize(o.Profile)
		}
	}
	t, err := OpenTarget(ctx, cfg.Target, open)
	if err != nil {
		return err
	}
	// Unless --keep, undo the allocation a write run causes in the holes
	// of an existing target (restore.go). A scratch file the benchmark
	// created is removed whole instead.
	var snap *holeSnapshot
	var notes []string
	if !open.ReadOnly && !open.Keep && !t.Info().Created {
		var note string
		if snap, note = snapshotHoles(t); note != "" {
			notes = append(notes, note)
		}
	}
	prog, wait := NewProgress(stderr, cfg.Quiet || cfg.JSON && !IsTerminal(stderr))
	stopOverall := startOverall(prog, Estimate(o))
	res, runErr := RunProfile(ctx, t, o, prog)
	stopOverall()
	wait()
	if snap != nil {
		// Also after a failed or interrupted run: that is when test data
		// is most likely left behind.
		note, err := snap.restore()
		if err != nil {
			note = "holes not restored: " + err.Error()
			fmt.Fprintln(stderr, "vmsan bench: warning:", note)
		}
		if note != "" {
			notes = append(notes, note)
		}
	}
	if cerr := t.Close(); runErr == nil && cerr != nil {
		runErr = cerr
	}
	if res == nil {
		return runErr
	}
	res.Notes = append(res.Notes, notes...)
	if runErr != nil {
		res.Notes = append(res.Notes, "run failed: "+runErr.Error())
	}
	if cfg.JSON {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
	} else if runErr == nil {
		PrintTable(stdout, res)
	}
	out := cfg.Out
	if out == "" {
		dir := cfg.ResultsDir
		if dir == "" {
			dir = DefaultResultsDir()
		}
		out = filepath.Join(dir, fmt.Sprintf("vmsan-bench-%s-%s.json", o.Profile, res.Started.Format("20060102-150405")))
	}
	if out != "none" && len(res.Ops) > 0 {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return errors.Join(runErr, fmt.Errorf("bench: results directory: %w", err))
		}
		if err := res.Save(out); err != nil {
			return errors.Join(runErr, err)
		}
		if !cfg.JSON {
			fmt.Fprintf(stdout, "result: %s\n", out)
		}
	}
	if cfg.Plot != "" && runErr == nil {
		if err := Plot(cfg.Plot, []string{resultLabel(res, out)}, []*Result{res}, cfg.PlotOpts); err != nil {
			return err
		}
		if !cfg.JSON {
			fmt.Fprintf(stdout, "plot: %s\n", cfg.Plot)
		}
	}
	return runErr
}

func resultLabel(r *Result, path string) string {
	if path != "" && path != "none" {
		return strings.TrimSuffix(filepath.Base(path), ".json")
	}
	return r.Target.URI
}

// CompareFiles loads results and prints them side by side (or as JSON),
// optionally plotting them.
func CompareFiles(paths []string, plotPath string, asJSON bool, stdout *os.File, opts ...PlotOptions) error {
	if len(paths) < 1 {
		return errors.New("bench compare: give at least one result file")
	}
	var rs []*Result
	var names []string
	for _, p := range paths {
		r, err := LoadResult(p)
		if err != nil {
			return err
		}
		rs = append(rs, r)
		names = append(names, resultLabel(r, p))
	}
	if asJSON {
		b, err := json.MarshalIndent(CompareRows(names, rs), "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
	} else {
		Compare(stdout, names, rs)
	}
	if plotPath != "" {
		return Plot(plotPath, names, rs, opts...)
	}
	return nil
}

// CompareRow is one row of a comparison in JSON form.
type CompareRow struct {
	Profile string     `json:"profile"`
	Test    string     `json:"test"`
	Dir     string     `json:"dir"`
	Unit    string     `json:"unit"`
	Values  []*float64 `json:"values"`         // one per result, null when absent
	Change  []*float64 `json:"change_percent"` // vs the first result
}

// CompareRows computes what Compare prints.
func CompareRows(names []string, rs []*Result) []CompareRow {
	var out []CompareRow
	idx := map[string]int{}
	for ri, r := range rs {
		for _, o := range r.Ops {
			k := r.Profile + "\x00" + o.Key()
			i, ok := idx[k]
			if !ok {
				i = len(out)
				idx[k] = i
				_, u := o.Headline()
				out = append(out, CompareRow{Profile: r.Profile, Test: o.Name, Dir: o.Dir, Unit: u, Values: make([]*float64, len(rs)), Change: make([]*float64, len(rs))})
			}
			v, _ := o.Headline()
			out[i].Values[ri] = &v
		}
	}
	for i := range out {
		b := out[i].Values[0]
		for j := 1; j < len(rs); j++ {
			if b != nil && *b > 0 && out[i].Values[j] != nil {
				c := (*out[i].Values[j] - *b) / *b * 100
				out[i].Change[j] = &c
			}
		}
	}
	return out
}

// ParseDuration accepts Go durations ("500ms", "5s") or plain seconds ("5").
func ParseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}
