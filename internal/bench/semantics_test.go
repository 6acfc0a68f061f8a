package bench

import (
	"context"
	"sync"
	"testing"
	"time"
)

// memTarget is an in-memory Target that logs every request, so tests can
// check what a profile actually does against what the original tool does.
type memTarget struct {
	mu      sync.Mutex
	data    []byte
	log     []ioRec
	flushes int
	created bool
}

type ioRec struct {
	write bool
	off   int64
	n     int
}

func (m *memTarget) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(p, m.data[off:])
	m.log = append(m.log, ioRec{false, off, len(p)})
	return len(p), nil
}

func (m *memTarget) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.data[off:], p)
	m.log = append(m.log, ioRec{true, off, len(p)})
	return len(p), nil
}

func (m *memTarget) Flush() error {
	m.mu.Lock()
	m.flushes++
	m.mu.Unlock()
	return nil
}
func (m *memTarget) Size() int64 { return int64(len(m.data)) }
func (m *memTarget) Align() int  { return 1 }
func (m *memTarget) MaxIO() int  { return 0 }
func (m *memTarget) Info() TargetInfo {
	return TargetInfo{URI: "mem", Kind: "mem", Size: int64(len(m.data)), Created: m.created}
}
func (m *memTarget) Close() error { return nil }

// TestBonnieSemantics: the bonnie profile does what bonnie++ 1.97 does, in
// order: per-char writes of 1 byte over the per-char region, chunk writes
// over the whole size then a flush, rewrite (read+write of every chunk at
// the same offset) then a flush, per-char reads, chunk reads, and the
// random seeks (exact count, ~10% written back).
func TestBonnieSemantics(t *testing.T) {
	const size, chunk, chr, seeks = 4 << 20, 8192, 64 << 10, 2000
	m := &memTarget{data: make([]byte, 8<<20), created: true}
	res, err := RunProfile(context.Background(), m, Options{Profile: ProfileBonnie, BonnieSize: size, Chunk: chunk, ChrSize: chr, Seeks: seeks, SeekProcs: 5, ChrTime: time.Minute, Seed: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := m.log
	take := func(n int, write bool, bs int, what string) []ioRec {
		t.Helper()
		if len(log) < n {
			t.Fatalf("%s: %d requests left, want %d", what, len(log), n)
		}
		for i, r := range log[:n] {
			if r.write != write || r.n != bs {
				t.Fatalf("%s: request %d is %+v", what, i, r)
			}
		}
		out := log[:n]
		log = log[n:]
		return out
	}
	pc := take(chr, true, 1, "putc")
	if pc[0].off != 0 || pc[chr-1].off != chr-1 {
		t.Fatal("putc not sequential over the per-char region")
	}
	take(size/chunk, true, chunk, "block write")
	for i := 0; i < size/chunk; i++ {
		r, w := log[2*i], log[2*i+1]
		if r.write || !w.write || r.off != w.off || r.off != int64(i*chunk) {
			t.Fatalf("rewrite chunk %d: %+v %+v", i, r, w)
		}
	}
	log = log[2*size/chunk:]
	take(chr, false, 1, "getc")
	take(size/chunk, false, chunk, "block read")
	var reads, writes int
	for _, r := range log {
		if r.n != chunk || r.off%chunk != 0 || r.off >= size {
			t.Fatalf("seek request %+v", r)
		}
		if r.write {
			writes++
		} else {
			reads++
		}
	}
	if reads != seeks {
		t.Fatalf("%d seek reads, want %d", reads, seeks)
	}
	if f := float64(writes) / seeks; f < 0.06 || f > 0.14 {
		t.Fatalf("%.1f%% of seeks rewritten, want about 10%%", f*100)
	}
	if m.flushes != 3 {
		t.Fatalf("%d flushes; putc, block write and rewrite each end with one (bonnie++ fsyncs at close)", m.flushes)
	}
	r, _ := res.Row(BonnieSeeks + " read")
	if r.Ops != seeks || r.Metric != MetricIOPS {
		t.Fatalf("seeks row: %+v", r)
	}
}

// TestGnomeSemantics: samples evenly spaced from the first to the last
// possible offset, one request each, written back unchanged with --write;
// then the access-time reads, one page each, anywhere on the target.
func TestGnomeSemantics(t *testing.T) {
	m := &memTarget{data: make([]byte, 64<<20)}
	for i := range m.data {
		m.data[i] = byte(i * 7)
	}
	orig := append([]byte(nil), m.data...)
	const n, ss, acc = 9, 1 << 20, 300
	res, err := RunProfile(context.Background(), m, Options{Profile: ProfileGnome, Samples: n, SampleSize: ss, AccessReads: acc, WriteTest: true, Force: true, Seed: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := m.log // Force: no probe read for existing data

	span := int64(64<<20 - ss)
	for i := 0; i < n; i++ {
		r, w := log[2*i], log[2*i+1]
		want := span * int64(i) / (n - 1)
		if r.write || !w.write || r.off != want || w.off != want || r.n != ss || w.n != ss {
			t.Fatalf("sample %d: %+v %+v, want offset %d", i, r, w, want)
		}
	}
	log = log[2*n:]
	if len(log) != acc {
		t.Fatalf("%d access reads, want %d", len(log), acc)
	}
	for _, r := range log {
		if r.write || r.n != 4096 || r.off%4096 != 0 {
			t.Fatalf("access read %+v", r)
		}
	}
	for i := range orig {
		if m.data[i] != orig[i] {
			t.Fatalf("write test changed byte %d", i)
		}
	}
	if res.Gnome.MinRead > res.Gnome.AvgRead || res.Gnome.AvgRead > res.Gnome.MaxRead || len(res.Gnome.Samples) != n {
		t.Fatalf("gnome summary inconsistent: %+v", res.Gnome)
	}
}

// TestCDMSemantics: the test area is filled before anything is read, the
// rows are CrystalDiskMark 8's, and every request stays inside the area.
func TestCDMSemantics(t *testing.T) {
	m := &memTarget{data: make([]byte, 32<<20), created: true}
	const area = 8 << 20
	res, err := RunProfile(context.Background(), m, Options{Profile: ProfileCDM, Area: area, Passes: 2, PassTime: 30 * time.Millisecond, Warmup: 10 * time.Millisecond, Seed: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var filled int64
	i := 0
	for ; i < len(m.log) && m.log[i].write; i++ {
		filled += int64(m.log[i].n)
	}
	if filled != area {
		t.Fatalf("fill wrote %d bytes before the first read, want the whole area %d", filled, area)
	}
	for _, r := range m.log {
		if r.off+int64(r.n) > area {
			t.Fatalf("request %+v outside the test area", r)
		}
	}
	want := []string{"SEQ1M Q8T1 read", "SEQ1M Q1T1 read", "RND4K Q32T1 read", "RND4K Q1T1 read", "SEQ1M Q8T1 write", "SEQ1M Q1T1 write", "RND4K Q32T1 write", "RND4K Q1T1 write"}
	if len(res.Ops) != len(want) {
		t.Fatalf("%d rows", len(res.Ops))
	}
	for i, w := range want {
		if res.Ops[i].Key() != w {
			t.Fatalf("row %d is %q, want %q", i, res.Ops[i].Key(), w)
		}
	}
}
