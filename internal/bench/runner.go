package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/backend"
)

// Pattern names an access pattern, spelled as fio spells --rw.
type Pattern string

const (
	Read      Pattern = "read"
	Write     Pattern = "write"
	RandRead  Pattern = "randread"
	RandWrite Pattern = "randwrite"
	RandRW    Pattern = "randrw"
	ReadWrite Pattern = "rw" // sequential mixed
)

// ParsePattern validates a --rw value.
func ParsePattern(s string) (Pattern, error) {
	switch p := Pattern(s); p {
	case Read, Write, RandRead, RandWrite, RandRW, ReadWrite:
		return p, nil
	case "readwrite":
		return ReadWrite, nil
	}
	return "", fmt.Errorf("bench: unknown --rw %q (want read, write, randread, randwrite, randrw or rw)", s)
}

func (p Pattern) random() bool  { return p == RandRead || p == RandWrite || p == RandRW }
func (p Pattern) reads() bool   { return p != Write && p != RandWrite }
func (p Pattern) writes() bool  { return p != Read && p != RandRead }
func (p Pattern) isMixed() bool { return p == RandRW || p == ReadWrite }

// JobSpec is one measured pass: fio's job model (rw, bs, iodepth, numjobs,
// runtime, size, rwmixread).
type JobSpec struct {
	Name    string // row label, e.g. "SEQ1M Q8T1"
	RW      Pattern
	BS      int           // block size in bytes
	QD      int           // requests in flight per job
	Jobs    int           // independent jobs (threads in CrystalDiskMark terms)
	Runtime time.Duration // stop after this long (0: one pass over the region)
	Offset  int64         // region start
	Size    int64         // region length (0: to the end of the target)
	RWMix   int           // percent reads for randrw/rw (default 50)
	MaxOps  int64         // stop after this many requests in total (0: no limit)
	Seed    uint64
}

// Dir counters for one direction of a measured pass.
type dirStats struct {
	ops, bytes int64
	hist       *hdrhistogram.Histogram
}

func newHist() *hdrhistogram.Histogram {
	// 1 ns .. 60 s at 3 significant digits: percentiles to 0.1%.
	return hdrhistogram.New(1, int64(60*time.Second), 3)
}

func (d *dirStats) record(n int, lat time.Duration) {
	d.ops++
	d.bytes += int64(n)
	if d.hist == nil {
		d.hist = newHist()
	}
	_ = d.hist.RecordValue(int64(lat)) // >60 s saturates: still counted in ops
}

func (d *dirStats) merge(o *dirStats) {
	d.ops += o.ops
	d.bytes += o.bytes
	if o.hist != nil {
		if d.hist == nil {
			d.hist = newHist()
		}
		d.hist.Merge(o.hist)
	}
}

// Measurement is the raw outcome of a pass, before it becomes rows.
type Measurement struct {
	Spec         JobSpec
	Elapsed      time.Duration
	CPU          float64 // process CPU time / wall time, percent (100 = one core)
	Read, Writes dirStats
}

// Row turns one direction of a measurement into a result row.
func (m *Measurement) Row(name string, write bool) OpResult {
	d := &m.Read
	dir := "read"
	if write {
		d = &m.Writes
		dir = "write"
	}
	r := OpResult{
		Name: name, Dir: dir, RW: string(m.Spec.RW), BS: m.Spec.BS, QD: m.Spec.QD, Jobs: m.Spec.Jobs,
		Ops: d.ops, Bytes: d.bytes, Seconds: m.Elapsed.Seconds(), CPU: m.CPU, Metric: MetricMBps,
	}
	r.fill(d.hist)
	return r
}

// Phase reports progress of one long-running step.
type Phase interface {
	// Set reports progress as done out of the total given to Start.
	Set(done int64)
	// Done ends the phase with a one-line summary.
	Done(summary string)
}

// Progress starts phases; implementations draw bars on a TTY or print
// plain lines. Safe for use from one goroutine at a time.
type Progress interface {
	Start(name string, total int64) Phase
}

type nopProgress struct{}
type nopPhase struct{}

func (nopProgress) Start(string, int64) Phase { return nopPhase{} }
func (nopPhase) Set(int64)                    {}
func (nopPhase) Done(string)                  {}

// Bounds on what a job may ask for: every in-flight request owns a buffer
// of the block size, so these cap the memory a command line can demand.
const (
	MaxInFlight  = 4096
	MaxBlockSize = 256 << 20
)

// Run executes one pass of spec against t and measures it.
//
// Every one of Jobs×QD workers owns its buffer, its random source and its
// histograms, so the hot loop allocates nothing and shares only an atomic
// cursor (sequential patterns) and the stop flag.
func Run(ctx context.Context, t Target, spec JobSpec, prog Progress) (*Measurement, error) {
	if prog == nil {
		prog = nopProgress{}
	}
	if spec.QD <= 0 {
		spec.QD = 1
	}
	if spec.Jobs <= 0 {
		spec.Jobs = 1
	}
	if spec.RWMix <= 0 || spec.RWMix > 100 {
		spec.RWMix = 50
	}
	if spec.QD*spec.Jobs > MaxInFlight {
		return nil, fmt.Errorf("bench: iodepth × jobs = %d exceeds %d requests in flight", spec.QD*spec.Jobs, MaxInFlight)
	}
	if spec.BS > MaxBlockSize {
		return nil, fmt.Errorf("bench: block size %d exceeds %d", spec.BS, MaxBlockSize)
	}
	al := int64(t.Align())
	if spec.BS <= 0 || int64(spec.BS)%al != 0 {
		return nil, fmt.Errorf("bench: block size %d is not a positive multiple of the target's alignment %d", spec.BS, al)
	}
	if mx := t.MaxIO(); mx > 0 && spec.BS > mx {
		return nil, fmt.Errorf("bench: block size %d exceeds the target's maximum request %d", spec.BS, mx)
	}
	if spec.Offset < 0 || spec.Offset%al != 0 || spec.Offset >= t.Size() {
		return nil, fmt.Errorf("bench: region offset %d outside the target", spec.Offset)
	}
	if spec.Size <= 0 || spec.Offset+spec.Size > t.Size() {
		spec.Size = t.Size() - spec.Offset
	}
	nblocks := spec.Size / int64(spec.BS)
	if nblocks <= 0 {
		return nil, fmt.Errorf("bench: region of %d bytes is smaller than one block of %d", spec.Size, spec.BS)
	}
	maxOps := spec.MaxOps
	if spec.Runtime <= 0 && maxOps <= 0 {
		maxOps = nblocks * int64(spec.Jobs) // one pass per job, like fio --size
	}

	var (
		stop    atomic.Bool
		issued  atomic.Int64 // requests started, for MaxOps
		done    atomic.Int64 // requests completed, for progress
		firstEr error
		erOnce  sync.Once
		wg      sync.WaitGroup
	)
	cursors := make([]atomic.Int64, spec.Jobs)
	nw := spec.Jobs * spec.QD
	stats := make([]struct{ r, w dirStats }, nw)
	fail := func(err error) {
		erOnce.Do(func() { firstEr = err })
		stop.Store(true)
	}

	total := maxOps
	if spec.Runtime > 0 {
		total = spec.Runtime.Milliseconds()
	}
	phName := spec.Name
	if !strings.Contains(phName, string(spec.RW)) {
		phName += " " + string(spec.RW)
	}
	ph := prog.Start(phName, total)
	ru0 := rusage()
	start := time.Now()
	deadline := start.Add(spec.Runtime)
	// next picks the offset and direction of a job's next request.
	next := func(rng *rand.Rand, job int) (int64, bool) {
		var blk int64
		if spec.RW.random() {
			blk = rng.Int64N(nblocks)
		} else {
			blk = (cursors[job].Add(1) - 1) % nblocks
		}
		write := spec.RW == Write || spec.RW == RandWrite
		if spec.RW.isMixed() {
			write = rng.IntN(100) >= spec.RWMix
		}
		return spec.Offset + blk*int64(spec.BS), write
	}
	dirName := map[bool]string{true: "write", false: "read"}
	var queues []Queue
	if at, ok := t.(AsyncTarget); ok && spec.QD > 1 {
		for j := 0; j < spec.Jobs; j++ {
			q, err := at.NewQueue(spec.QD)
			if err != nil {
				for _, q := range queues {
					q.Close()
				}
				queues = nil
				break
			}
			queues = append(queues, q)
		}
	}
	if queues != nil {
		// fio's model: one goroutine per job keeps QD requests in flight
		// through an asynchronous queue.
		for j := 0; j < spec.Jobs; j++ {
			wg.Add(1)
			go func(job int) {
				defer wg.Done()
				q := queues[job]
				defer q.Close()
				rng := rand.New(rand.NewPCG(spec.Seed+uint64(job)*0x9E3779B97F4A7C15, uint64(job)+1))
				bufs := make([][]byte, spec.QD)
				starts := make([]time.Time, spec.QD)
				isW := make([]bool, spec.QD)
				comps := make([]Completion, spec.QD)
				st := &stats[job*spec.QD]
				inflight := 0
				submit := func(tag int) bool {
					if stop.Load() || (maxOps > 0 && issued.Add(1) > maxOps) {
						return false
					}
					off, w := next(rng, job)
					if bufs[tag] == nil {
						bufs[tag] = backend.AlignedBuf(spec.BS, int(al))
						fillRandom(rng, bufs[tag])
					}
					isW[tag] = w
					starts[tag] = time.Now()
					if err := q.Submit(w, bufs[tag], off, tag); err != nil {
						fail(fmt.Errorf("bench: %s at offset %d: %w", dirName[w], off, err))
						return false
					}
					inflight++
					return true
				}
				for tag := 0; tag < spec.QD; tag++ {
					if !submit(tag) {
						break
					}
				}
				for inflight > 0 {
					n, err := q.Reap(1, comps)
					if err != nil {
						fail(fmt.Errorf("bench: %w", err))
						return // the queue is destroyed with requests in flight; io_destroy waits for them
					}
					now := time.Now()
					for _, c := range comps[:n] {
						inflight--
						if c.Err != nil {
							fail(fmt.Errorf("bench: %s: %w", dirName[isW[c.Tag]], c.Err))
							continue
						}
						if isW[c.Tag] {
							st.w.record(c.N, now.Sub(starts[c.Tag]))
						} else {
							st.r.record(c.N, now.Sub(starts[c.Tag]))
						}
						done.Add(1)
						if spec.Runtime > 0 && !now.Before(deadline) {
							stop.Store(true)
						}
						submit(c.Tag)
					}
				}
			}(j)
		}
	}
	for w := 0; queues == nil && w < nw; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			job := w / spec.QD
			rng := rand.New(rand.NewPCG(spec.Seed+uint64(w)*0x9E3779B97F4A7C15, uint64(w)+1))
			buf := backend.AlignedBuf(spec.BS, int(al))
			fillRandom(rng, buf) // written data is incompressible and not all-zero
			st := &stats[w]
			for !stop.Load() {
				if maxOps > 0 && issued.Add(1) > maxOps {
					return
				}
				off, write := next(rng, job)
				t0 := time.Now()
				var n int
				var err error
				if write {
					n, err = t.WriteAt(buf, off)
				} else {
					n, err = t.ReadAt(buf, off)
				}
				lat := time.Since(t0)
				if err != nil {
					fail(fmt.Errorf("bench: %s at offset %d: %w", dirName[write], off, err))
					return
				}
				if write {
					st.w.record(n, lat)
				} else {
					st.r.record(n, lat)
				}
				done.Add(1)
				if spec.Runtime > 0 && !t0.Before(deadline) {
					stop.Store(true)
				}
			}
		}(w)
	}

	// Progress and cancellation watcher.
	finished := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-finished:
				return
			case <-ctx.Done():
				fail(ctx.Err())
				return
			case now := <-tk.C:
				if spec.Runtime > 0 {
					ph.Set(now.Sub(start).Milliseconds())
					if !now.Before(deadline) {
						// A stalled target must not stretch the pass forever.
						stop.Store(true)
					}
				} else {
					ph.Set(done.Load())
				}
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(finished)
	watcher.Wait() // no Set may race with Done below
	ru1 := rusage()

	m := &Measurement{Spec: spec, Elapsed: elapsed}
	if elapsed > 0 {
		m.CPU = float64(ru1-ru0) / float64(elapsed) * 100
	}
	for i := range stats {
		m.Read.merge(&stats[i].r)
		m.Writes.merge(&stats[i].w)
	}
	if firstEr != nil && !errors.Is(firstEr, context.Canceled) {
		ph.Done("failed: " + firstEr.Error())
		return m, firstEr
	}
	if firstEr != nil {
		ph.Done("cancelled")
		return m, firstEr
	}
	ph.Done(m.summary())
	return m, nil
}

func (m *Measurement) summary() string {
	s := ""
	sec := m.Elapsed.Seconds()
	if m.Read.ops > 0 {
		s += fmt.Sprintf("read %.2f MB/s %.0f IOPS", float64(m.Read.bytes)/1e6/sec, float64(m.Read.ops)/sec)
	}
	if m.Writes.ops > 0 {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("write %.2f MB/s %.0f IOPS", float64(m.Writes.bytes)/1e6/sec, float64(m.Writes.ops)/sec)
	}
	return s
}

// fillRandom fills b with pseudo-random bytes.
func fillRandom(r *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// rusage is this process's user+system CPU time in nanoseconds.
func rusage() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// Fill writes pseudo-random data over [off, off+size) of t with large
// sequential writes at queue depth 4 and flushes, so that later reads hit
// allocated, non-zero data (a sparse hole reads faster than any disk).
func Fill(ctx context.Context, t Target, off, size int64, prog Progress) error {
	bs := 1 << 20
	if mx := t.MaxIO(); mx > 0 && mx < bs {
		bs = mx / t.Align() * t.Align()
	}
	if size < int64(bs) {
		bs = int(size) / t.Align() * t.Align()
		if bs == 0 {
			return nil
		}
	}
	_, err := Run(ctx, t, JobSpec{Name: "prepare", RW: Write, BS: bs, QD: 4, Jobs: 1, Offset: off, Size: size, Seed: 1}, prog)
	if err != nil {
		return err
	}
	return t.Flush()
}
