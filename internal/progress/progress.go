// Package progress draws the progress of a long operation (volume import
// and export, a benchmark and its phases): a bar with percent, amount,
// rate and ETA on a terminal, and on anything else (a log, CI) one plain
// line every LinePeriod with the same figures, so the output stays
// readable.
//
// Simplest use:
//
//	b := progress.New(os.Stderr, "import", size, progress.Bytes)
//	for ... { b.Set(done) }
//	b.Done("")                       // or b.Done("12.3 GiB in 41 s")
//
// The figures (Percent, ETA, FormatETA, Line) are plain functions so that
// every caller shows them alike; tests check them without a terminal.
//
// Concurrency: a Bar's Set may be called from any goroutine while the bar
// is drawn; Done once, after the last Set.
package progress

import (
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"
)

// Unit says how amounts are shown.
type Unit int

const (
	Count  Unit = iota // plain counts ("1200/5000")
	Bytes              // binary sizes ("1.2 GiB/2.8 GiB") and a rate
	Millis             // milliseconds of an estimated duration ("1m20s")
)

// LinePeriod is how often a plain-line progress reports.
var LinePeriod = 10 * time.Second

// IsTerminal reports whether f is a terminal with a known width (a
// terminal of 0 columns would render no bar).
func IsTerminal(f *os.File) bool {
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	return err == nil && ws.Col > 0
}

// Percent is done/total in whole percent, 0..100 (0 for an unknown total).
func Percent(done, total int64) int {
	if total <= 0 || done <= 0 {
		return 0
	}
	if done >= total {
		return 100
	}
	return int(done * 100 / total)
}

// ETA estimates the time left from the average rate so far; ok is false
// until something is done (no rate yet) or when the total is unknown.
func ETA(done, total int64, elapsed time.Duration) (left time.Duration, ok bool) {
	if total <= 0 || done <= 0 || elapsed <= 0 {
		return 0, false
	}
	if done >= total {
		return 0, true
	}
	rate := float64(done) / elapsed.Seconds()
	s := float64(total-done) / rate
	if math.IsInf(s, 0) || math.IsNaN(s) || s > 100*24*3600 {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)).Round(time.Second), true
}

// FormatETA renders a duration as M:SS, or H:MM:SS from an hour on;
// "--:--" when unknown.
func FormatETA(d time.Duration, ok bool) string {
	if !ok {
		return "--:--"
	}
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// Amount renders n in the unit.
func Amount(n int64, u Unit) string {
	switch u {
	case Bytes:
		return humanBytes(n)
	case Millis:
		return (time.Duration(n) * time.Millisecond).Round(time.Second).String()
	}
	return fmt.Sprint(n)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Line is the plain-line form: "import: 43% (1.2 GiB of 2.8 GiB, 85.3
// MiB/s), ETA 0:19".
func Line(name string, done, total int64, elapsed time.Duration, u Unit) string {
	left, ok := ETA(done, total, elapsed)
	amt := Amount(done, u) + " of " + Amount(total, u)
	if u == Bytes && elapsed > 0 {
		amt += ", " + humanBytes(int64(float64(done)/elapsed.Seconds())) + "/s"
	}
	return fmt.Sprintf("%s: %d%% (%s), ETA %s", name, Percent(done, total), amt, FormatETA(left, ok))
}

// Bar is one operation's progress.
type Bar struct {
	name  string
	total int64
	unit  Unit
	start time.Time

	// terminal
	p   *mpb.Progress
	bar *mpb.Bar

	// plain lines
	mu   sync.Mutex
	w    io.Writer
	last time.Time
	done int64
}

// New starts a bar on w: drawn when w is a terminal, plain lines
// otherwise. A nil w (quiet) shows nothing.
func New(w *os.File, name string, total int64, u Unit) *Bar {
	b := &Bar{name: name, total: total, unit: u, start: time.Now(), last: time.Now()}
	if w == nil {
		return b
	}
	if !IsTerminal(w) {
		b.w = w
		return b
	}
	b.p = mpb.New(mpb.WithOutput(w), mpb.WithWidth(40))
	b.bar = b.p.AddBar(max(total, 1), BarOptions(name, u)...)
	return b
}

// BarOptions are the decorators of a terminal bar: name, then percent,
// amount (and rate) and ETA, as Line shows them.
func BarOptions(name string, u Unit) []mpb.BarOption {
	amount := decor.CountersNoUnit("%d / %d", decor.WCSyncSpace)
	rate := decor.Name("")
	if u == Bytes {
		amount = decor.CountersKibiByte("% .1f / % .1f", decor.WCSyncSpace)
		rate = decor.AverageSpeed(decor.SizeB1024(0), "% .1f", decor.WCSyncSpace)
	}
	return []mpb.BarOption{
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.Percentage(decor.WC{W: 5})),
		mpb.AppendDecorators(amount, rate, decor.Name(" ETA "), decor.OnComplete(decor.AverageETA(decor.ET_STYLE_MMSS), "done")),
	}
}

// Set reports done out of the total.
func (b *Bar) Set(done int64) {
	if b.bar != nil {
		b.bar.SetCurrent(min(done, b.total))
		return
	}
	if b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = done
	if now := time.Now(); now.Sub(b.last) >= LinePeriod {
		b.last = now
		fmt.Fprintln(b.w, Line(b.name, done, b.total, now.Sub(b.start), b.unit))
	}
}

// Done completes the bar; a plain-line progress prints summary (or the
// final figures when it is empty).
func (b *Bar) Done(summary string) {
	if b.bar != nil {
		b.bar.SetTotal(-1, true)
		b.p.Wait()
		return
	}
	if b.w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if summary == "" {
		summary = fmt.Sprintf("done, %s in %s", Amount(b.total, b.unit), time.Since(b.start).Round(time.Second))
	}
	fmt.Fprintf(b.w, "%s: %s\n", b.name, summary)
}
