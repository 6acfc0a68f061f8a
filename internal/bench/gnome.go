package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
)

// gnome-disks row names.
const (
	GnomeAvgRead  = "Avg Read Rate"
	GnomeMinRead  = "Min Read Rate"
	GnomeMaxRead  = "Max Read Rate"
	GnomeAvgWrite = "Avg Write Rate"
	GnomeMinWrite = "Min Write Rate"
	GnomeMaxWrite = "Max Write Rate"
	GnomeAccess   = "Access Time"
)

// maxAccessPoints bounds the access-time reads kept for the plot (and the
// JSON): --access-reads is unbounded, the scatter needs no more.
const maxAccessPoints = 10000

// runGnome reproduces GNOME Disks' (palimpsest's) benchmark: the transfer
// rate of o.Samples reads of o.SampleSize at evenly spaced offsets across
// the whole target (optionally writing each sample's data back, which
// preserves the contents), then o.AccessReads random one-page reads for the
// average access time.
func runGnome(ctx context.Context, t Target, o Options, prog Progress, res *Result) error {
	al := int64(t.Align())
	sample := min(o.SampleSize, MaxBlockSize) / al * al
	if mx := int64(t.MaxIO()); mx > 0 && sample > mx {
		// One request per sample where possible; else the largest allowed.
		sample = mx / al * al
	}
	if sample > t.Size() {
		sample = t.Size() / al * al
	}
	if sample <= 0 {
		return fmt.Errorf("bench: target too small for a gnome-disks sample")
	}
	n := o.Samples
	write := o.WriteTest && !o.ReadOnly
	if write {
		if err := checkWritable(t, o.Force); err != nil {
			return err
		}
	}
	if t.Info().Created && !o.ReadOnly {
		if err := Fill(ctx, t, 0, t.Size(), prog); err != nil {
			return err
		}
	}
	res.Params["samples"] = n
	res.Params["sample_bytes"] = sample
	res.Params["write_test"] = write
	res.Params["access_reads"] = o.AccessReads

	g := &GnomeResult{SampleSize: sample, MinRead: math.Inf(1), MinWrite: math.Inf(1)}
	buf := backend.AlignedBuf(int(sample), int(al))
	span := t.Size() - sample
	ph := prog.Start("gnome-disks transfer rate", int64(n))
	var rd, wr dirStats
	var rdTime, wrTime time.Duration
	dropCache(t, o)
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		off := int64(0)
		if n > 1 {
			off = span * int64(i) / int64(n-1) / al * al
		}
		t0 := time.Now()
		if _, err := t.ReadAt(buf, off); err != nil {
			return fmt.Errorf("bench: gnome-disks read at %d: %w", off, err)
		}
		d := time.Since(t0)
		rd.record(len(buf), d)
		rdTime += d
		s := GnomeSample{Offset: off, ReadMBps: float64(sample) / MB / d.Seconds()}
		if write {
			t0 = time.Now()
			if _, err := t.WriteAt(buf, off); err != nil {
				return fmt.Errorf("bench: gnome-disks write at %d: %w", off, err)
			}
			// Each write sample is made durable, or the rate is the cache's.
			if err := t.Flush(); err != nil {
				return fmt.Errorf("bench: gnome-disks flush: %w", err)
			}
			d = time.Since(t0)
			wr.record(len(buf), d)
			wrTime += d
			s.WriteMBps = float64(sample) / MB / d.Seconds()
			g.MinWrite = math.Min(g.MinWrite, s.WriteMBps)
			g.MaxWrite = math.Max(g.MaxWrite, s.WriteMBps)
		}
		g.MinRead = math.Min(g.MinRead, s.ReadMBps)
		g.MaxRead = math.Max(g.MaxRead, s.ReadMBps)
		g.Samples = append(g.Samples, s)
		ph.Set(int64(i + 1))
	}
	g.AvgRead = float64(rd.bytes) / MB / rdTime.Seconds()
	if write {
		g.AvgWrite = float64(wr.bytes) / MB / wrTime.Seconds()
	} else {
		g.MinWrite = 0
	}
	ph.Done(fmt.Sprintf("read min/avg/max %.1f/%.1f/%.1f MB/s", g.MinRead, g.AvgRead, g.MaxRead))

	// Access time: random page reads at QD1 across the whole target.
	page := int64(4096)
	if page < al {
		page = al
	}
	acc := backend.AlignedBuf(int(page), int(al))
	rng := rand.New(rand.NewPCG(o.Seed, 17))
	var at dirStats
	ph = prog.Start("gnome-disks access time", int64(o.AccessReads))
	nPages := t.Size() / page
	var accTotal time.Duration
	for i := 0; i < o.AccessReads; i++ {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			ph.Set(int64(i))
		}
		off := rng.Int64N(nPages) * page
		t0 := time.Now()
		if _, err := t.ReadAt(acc, off); err != nil {
			return fmt.Errorf("bench: gnome-disks access read at %d: %w", off, err)
		}
		d := time.Since(t0)
		at.record(len(acc), d)
		accTotal += d
		if len(g.Access) < maxAccessPoints {
			g.Access = append(g.Access, GnomeAccessPoint{Offset: off, Ms: d.Seconds() * 1000})
		}
	}
	g.AccessMs = accTotal.Seconds() * 1000 / float64(o.AccessReads)
	ph.Done(fmt.Sprintf("average access time %.3f ms", g.AccessMs))
	res.Gnome = g

	rate := func(name, dir string, v float64, st *dirStats, el time.Duration) OpResult {
		r := OpResult{Name: name, Dir: dir, RW: "gnome-disks", BS: int(sample), QD: 1, Jobs: 1, Ops: st.ops, Bytes: st.bytes, Seconds: el.Seconds(), Metric: MetricMBps}
		r.fill(st.hist)
		r.MBps = v // the row's headline is the min/avg/max rate, not the aggregate
		r.MiBps = v * MB / MiB
		return r
	}
	for _, x := range []struct {
		n string
		v float64
	}{{GnomeMinRead, g.MinRead}, {GnomeMaxRead, g.MaxRead}, {GnomeAvgRead, g.AvgRead}} {
		r := rate(x.n, "read", x.v, &rd, rdTime)
		markCached(t, t.Size(), &r, res)
		res.Ops = append(res.Ops, r)
	}
	if write {
		res.Ops = append(res.Ops,
			rate(GnomeMinWrite, "write", g.MinWrite, &wr, wrTime),
			rate(GnomeMaxWrite, "write", g.MaxWrite, &wr, wrTime),
			rate(GnomeAvgWrite, "write", g.AvgWrite, &wr, wrTime))
	}
	ar := OpResult{Name: GnomeAccess, Dir: "read", RW: "randread", BS: int(page), QD: 1, Jobs: 1, Ops: at.ops, Bytes: at.bytes, Seconds: accTotal.Seconds(), Metric: MetricMs}
	ar.fill(at.hist)
	markCached(t, t.Size(), &ar, res)
	res.Ops = append(res.Ops, ar)
	return nil
}
