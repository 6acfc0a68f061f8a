package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/progress"
)

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// NewProgress returns bars on a terminal and plain lines otherwise (one
// line per finished phase, so logs and CI output stay readable).
// quiet suppresses all output.
func NewProgress(w *os.File, quiet bool) (Progress, func()) {
	if quiet {
		return nopProgress{}, func() {}
	}
	// A terminal of unknown width (0 columns) would render nothing.
	if ws, err := unix.IoctlGetWinsize(int(w.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 && IsTerminal(w) {
		p := mpb.New(mpb.WithOutput(w), mpb.WithWidth(40))
		return &barProgress{p: p}, p.Wait
	}
	return &lineProgress{w: w}, func() {}
}

type lineProgress struct {
	mu sync.Mutex
	w  io.Writer
}

type linePhase struct {
	p     *lineProgress
	name  string
	total int64
	start time.Time
	last  time.Time
}

// linePeriod is how often a long phase reports progress as a plain line.
const linePeriod = 10 * time.Second

func (l *lineProgress) Start(name string, total int64) Phase {
	now := time.Now()
	return &linePhase{p: l, name: name, total: total, start: now, last: now}
}

func (p *linePhase) Set(done int64) {
	if p.total <= 0 || time.Since(p.last) < linePeriod {
		return
	}
	p.last = time.Now()
	p.p.mu.Lock()
	defer p.p.mu.Unlock()
	u := progress.Count
	if p.name == overallName {
		u = progress.Millis
	}
	fmt.Fprintf(p.p.w, "bench: %s\n", progress.Line(p.name, done, p.total, time.Since(p.start), u))
}
func (p *linePhase) Done(summary string) {
	p.p.mu.Lock()
	defer p.p.mu.Unlock()
	fmt.Fprintf(p.p.w, "bench: %s: %s\n", p.name, summary)
}

type barProgress struct{ p *mpb.Progress }

type barPhase struct {
	b     *mpb.Bar
	total int64
	sum   *atomic.Pointer[string] // read by mpb's render goroutine
}

func (b *barProgress) Start(name string, total int64) Phase {
	if total <= 0 {
		total = 1
	}
	sum := new(atomic.Pointer[string])
	empty := ""
	sum.Store(&empty)
	bar := b.p.AddBar(total,
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.OnComplete(decor.Percentage(decor.WC{W: 5}), "")),
		mpb.AppendDecorators(decor.OnComplete(decor.Name(" ETA "), ""), decor.OnComplete(decor.AverageETA(decor.ET_STYLE_MMSS), ""),
			decor.Any(func(decor.Statistics) string { return *sum.Load() })),
	)
	return &barPhase{b: bar, total: total, sum: sum}
}

func (p *barPhase) Set(done int64) {
	if done > p.total {
		done = p.total
	}
	p.b.SetCurrent(done)
}

func (p *barPhase) Done(summary string) {
	p.sum.Store(&summary)
	p.b.SetTotal(-1, true) // complete now, whatever the count reached
}

// overallName is the phase that shows the whole run's progress.
const overallName = "overall"

// Estimate is how long a profile's timed tests take with o (warm-ups,
// passes, pauses; not the fill before them), 0 when the profile is not
// time-based (bonnie, gnome-disks and a job without --runtime run for a
// count of operations).
func Estimate(o Options) time.Duration {
	o.Defaults()
	switch o.Profile {
	case ProfileCDM, ProfileCDMLegacy:
		rows := len(cdm8Rows)
		if o.Profile == ProfileCDMLegacy {
			rows = len(cdm3Rows)
		}
		dirs := 2
		if o.ReadOnly {
			dirs = 1
		}
		per := o.Warmup + time.Duration(o.Passes)*o.PassTime + time.Duration(max(o.Passes-1, 0))*o.Interval
		return time.Duration(dirs*rows) * per
	case ProfileJob:
		return o.Job.Runtime
	}
	return 0
}

// startOverall shows the whole run as one more phase, by time against
// est: percent and ETA of the run (capped below 100% until stop, as the
// estimate leaves out the fill). stop ends it.
func startOverall(prog Progress, est time.Duration) (stop func()) {
	if est <= 0 {
		return func() {}
	}
	total := est.Milliseconds()
	ph := prog.Start(overallName, total)
	start := time.Now()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				ph.Set(min(time.Since(start).Milliseconds(), total*99/100))
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		ph.Done(time.Since(start).Round(time.Second).String())
	}
}
