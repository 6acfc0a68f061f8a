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
	last  time.Time
}

// linePeriod is how often a long phase reports progress as a plain line.
const linePeriod = 10 * time.Second

func (l *lineProgress) Start(name string, total int64) Phase {
	return &linePhase{p: l, name: name, total: total, last: time.Now()}
}

func (p *linePhase) Set(done int64) {
	if p.total <= 0 || time.Since(p.last) < linePeriod {
		return
	}
	p.last = time.Now()
	p.p.mu.Lock()
	defer p.p.mu.Unlock()
	fmt.Fprintf(p.p.w, "bench: %s: %d%%\n", p.name, min(done*100/p.total, 100))
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
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.OnComplete(decor.Percentage(decor.WC{W: 5}), ""), decor.Any(func(decor.Statistics) string { return *sum.Load() })),
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
