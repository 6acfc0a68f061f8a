package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
)

// bonnie++ 1.97 test names, in table order. They are the row names of a
// bonnie result.
const (
	BonniePutc    = "Sequential Output Per Chr"
	BonnieBlock   = "Sequential Output Block"
	BonnieRewrite = "Sequential Output Rewrite"
	BonnieGetc    = "Sequential Input Per Chr"
	BonnieGetBlk  = "Sequential Input Block"
	BonnieSeeks   = "Random Seeks"
)

var bonnieOrder = []string{BonniePutc, BonnieBlock, BonnieRewrite, BonnieGetc, BonnieGetBlk, BonnieSeeks}

func runBonnie(ctx context.Context, t Target, o Options, prog Progress, res *Result) error {
	size := o.BonnieSize
	if size <= 0 {
		size = BonnieDefaultSize()
	}
	if size > t.Size() {
		addNote(res, fmt.Sprintf("bonnie: size capped at the target size %d bytes (asked %d)", t.Size(), size))
		size = t.Size()
	}
	al := t.Align()
	chunk := min(o.Chunk, MaxBlockSize)
	if chunk%al != 0 {
		chunk = (chunk/al + 1) * al
	}
	size = size / int64(chunk) * int64(chunk)
	if size <= 0 {
		return fmt.Errorf("bench: bonnie size smaller than one chunk of %d bytes", chunk)
	}
	chr := o.ChrSize
	if chr > size {
		chr = size
	}
	res.Params["size_bytes"] = size
	res.Params["chunk_bytes"] = chunk
	res.Params["chr_bytes"] = chr
	res.Params["seeks"] = o.Seeks
	res.Params["seek_procs"] = o.SeekProcs
	if o.ReadOnly {
		return fmt.Errorf("bench: the bonnie profile writes its test data; it cannot run read-only")
	}
	if err := checkWritable(t, o.Force); err != nil {
		return err
	}
	// Per-character tests issue one 1-byte request per byte: since 1.92
	// bonnie++ does them with write(2)/read(2) of one byte, not stdio.
	// O_DIRECT cannot do that.
	byteIO := al == 1
	if !byteIO {
		addNote(res, "bonnie: per-char tests skipped: the target needs aligned I/O (O_DIRECT); run without --direct to include them")
	}

	add := func(r OpResult) {
		res.Ops = append(res.Ops, r)
	}
	// Per Chr output: 1-byte writes, one pass over the per-char region or
	// until ChrTime, whichever is first.
	if byteIO {
		m, err := Run(ctx, t, JobSpec{Name: "bonnie putc", RW: Write, BS: 1, QD: 1, Jobs: 1, Size: chr, MaxOps: chr, Runtime: o.ChrTime, Seed: o.Seed}, prog)
		if err != nil {
			return err
		}
		// bonnie++ fsyncs every file it closes after writing (since 1.90b).
		r, err := withFlush(t, m, BonniePutc, true)
		if err != nil {
			return err
		}
		add(r)
	}
	// Block output: chunk writes over the whole size, then fsync (counted).
	m, err := Run(ctx, t, JobSpec{Name: "bonnie block write", RW: Write, BS: chunk, QD: 1, Jobs: 1, Size: size, Seed: o.Seed}, prog)
	if err != nil {
		return err
	}
	r, err := withFlush(t, m, BonnieBlock, true)
	if err != nil {
		return err
	}
	add(r)
	// Rewrite: read a chunk, dirty it, seek back, write it; fsync at the end.
	r, err = bonnieRewrite(ctx, t, size, chunk, prog)
	if err != nil {
		return err
	}
	add(r)
	if byteIO {
		dropCache(t, o)
		m, err := Run(ctx, t, JobSpec{Name: "bonnie getc", RW: Read, BS: 1, QD: 1, Jobs: 1, Size: chr, MaxOps: chr, Runtime: o.ChrTime, Seed: o.Seed}, prog)
		if err != nil {
			return err
		}
		r := m.Row(BonnieGetc, false)
		markCached(t, size, &r, res)
		add(r)
	}
	dropCache(t, o)
	m, err = Run(ctx, t, JobSpec{Name: "bonnie block read", RW: Read, BS: chunk, QD: 1, Jobs: 1, Size: size, Seed: o.Seed}, prog)
	if err != nil {
		return err
	}
	r = m.Row(BonnieGetBlk, false)
	markCached(t, size, &r, res)
	add(r)
	r, err = bonnieSeeks(ctx, t, size, chunk, o, prog)
	if err != nil {
		return err
	}
	markCached(t, size, &r, res)
	add(r)
	res.BonnieCS = BonnieCSV(res)
	return nil
}

// withFlush turns a write pass into a row whose time includes the final
// fsync, as bonnie++ counts the fsync at close.
func withFlush(t Target, m *Measurement, name string, write bool) (OpResult, error) {
	ru0 := rusage()
	t0 := time.Now()
	if err := t.Flush(); err != nil {
		return OpResult{}, fmt.Errorf("bench: flush: %w", err)
	}
	fl := time.Since(t0)
	cpu := m.CPU*m.Elapsed.Seconds()/100 + float64(rusage()-ru0)/1e9
	m.Elapsed += fl
	m.CPU = cpu / m.Elapsed.Seconds() * 100
	return m.Row(name, write), nil
}

func bonnieRewrite(ctx context.Context, t Target, size int64, chunk int, prog Progress) (OpResult, error) {
	buf := backend.AlignedBuf(chunk, t.Align())
	var st dirStats
	n := size / int64(chunk)
	ph := prog.Start("bonnie rewrite", n)
	ru0 := rusage()
	start := time.Now()
	for i := int64(0); i < n; i++ {
		if i&255 == 0 {
			if err := ctx.Err(); err != nil {
				return OpResult{}, err
			}
			ph.Set(i)
		}
		off := i * int64(chunk)
		t0 := time.Now()
		if _, err := t.ReadAt(buf, off); err != nil {
			return OpResult{}, fmt.Errorf("bench: rewrite read at %d: %w", off, err)
		}
		buf[int(i)%chunk]++ // dirty it
		if _, err := t.WriteAt(buf, off); err != nil {
			return OpResult{}, fmt.Errorf("bench: rewrite write at %d: %w", off, err)
		}
		st.record(chunk, time.Since(t0))
	}
	m := &Measurement{Spec: JobSpec{RW: "rewrite", BS: chunk, QD: 1, Jobs: 1}, Elapsed: time.Since(start), Writes: st}
	m.CPU = float64(rusage()-ru0) / float64(m.Elapsed) * 100
	r, err := withFlush(t, m, BonnieRewrite, true)
	ph.Done(fmt.Sprintf("%.2f MB/s", r.MBps))
	return r, err
}

// bonnieSeeks runs o.Seeks random chunk reads from o.SeekProcs parallel
// workers; about 10% of the chunks read are dirtied and written back.
func bonnieSeeks(ctx context.Context, t Target, size int64, chunk int, o Options, prog Progress) (OpResult, error) {
	nblk := size / int64(chunk)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		all   dirStats
		first error
	)
	ph := prog.Start("bonnie seeks", int64(o.Seeks))
	ru0 := rusage()
	start := time.Now()
	for w := 0; w < o.SeekProcs; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(w)+101))
			buf := backend.AlignedBuf(chunk, t.Align())
			var st dirStats
			var err error
			for next.Add(1) <= int64(o.Seeks) && ctx.Err() == nil {
				off := rng.Int64N(nblk) * int64(chunk)
				t0 := time.Now()
				if _, err = t.ReadAt(buf, off); err != nil {
					break
				}
				if rng.IntN(10) == 0 {
					buf[0]++
					if _, err = t.WriteAt(buf, off); err != nil {
						break
					}
				}
				st.record(chunk, time.Since(t0))
			}
			mu.Lock()
			all.merge(&st)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	m := &Measurement{Spec: JobSpec{RW: "seeks", BS: chunk, QD: o.SeekProcs, Jobs: 1}, Elapsed: time.Since(start), Read: all}
	m.CPU = float64(rusage()-ru0) / float64(m.Elapsed) * 100
	if first != nil {
		return OpResult{}, fmt.Errorf("bench: seeks: %w", first)
	}
	if err := ctx.Err(); err != nil {
		return OpResult{}, err
	}
	r := m.Row(BonnieSeeks, false)
	r.Metric = MetricIOPS
	ph.Done(fmt.Sprintf("%.1f seeks/s", r.IOPS))
	return r, nil
}

// BonnieCSV renders the bonnie++ 1.97 CSV line (format version 1.97) for a
// bonnie result. File-creation fields are empty: vmsan bench measures a
// block target, not a filesystem's metadata.
func BonnieCSV(res *Result) string {
	row := func(name string) (OpResult, bool) { return res.Row(name + " " + dirOf(name)) }
	kps := func(name string) string {
		r, ok := row(name)
		if !ok {
			return ","
		}
		if name == BonnieSeeks {
			return fmt.Sprintf("%.1f,%d", r.IOPS, int(r.CPU+0.5))
		}
		return fmt.Sprintf("%d,%d", int64(float64(r.Bytes)/KiB/r.Seconds), int(r.CPU+0.5))
	}
	lat := func(name string) string {
		r, ok := row(name)
		if !ok {
			return ""
		}
		return bonnieLatency(r.Lat.MaxUs)
	}
	host := res.Env.Hostname
	if host == "" {
		host = "vmsan"
	}
	size, _ := res.Params["size_bytes"].(int64)
	chunk, _ := res.Params["chunk_bytes"].(int)
	s := fmt.Sprintf("1.97,1.97,%s,1,%d,%s,%d", host, res.Started.Unix(), bonnieSize(size), chunk)
	for _, n := range bonnieOrder {
		s += "," + kps(n)
	}
	s += ",,,,,,,,,,,,,,,,," // num_files .. ran_del_cpu
	for _, n := range bonnieOrder {
		s += "," + lat(n)
	}
	s += ",,,,,," // file-creation latencies
	return s
}

func dirOf(name string) string {
	switch name {
	case BonniePutc, BonnieBlock, BonnieRewrite:
		return "write"
	}
	return "read"
}

// bonnieLatency formats a latency as bonnie++ does: us below 10 ms, ms
// below 10 s, else s.
func bonnieLatency(us float64) string {
	switch {
	case us < 10000:
		return fmt.Sprintf("%dus", int64(us+0.5))
	case us < 10e6:
		return fmt.Sprintf("%dms", int64(us/1000+0.5))
	}
	return fmt.Sprintf("%ds", int64(us/1e6+0.5))
}

// bonnieSize prints a size as bonnie++'s Size column does (G or M).
func bonnieSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}
