package ioengine_test

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/ioengine"
)

// benchEngine runs b.N 4 KiB requests from GOMAXPROCS*8 concurrent clients
// (RunParallel with SetParallelism) through an engine over Mem, reporting
// allocs/op: the engine's own bookkeeping should add none per request.
func benchEngine(b *testing.B, op ioengine.Op, seq bool) {
	benchEngineCfg(b, op, seq, ioengine.Config{})
}

func benchEngineCfg(b *testing.B, op ioengine.Op, seq bool, cfg ioengine.Config) {
	const size = 64 << 20
	m := backend.NewMem(size)
	// Allocate every page first so Mem's page allocations do not show up
	// as the engine's allocs/op.
	if err := m.WritevAt([][]byte{make([]byte, size)}, 0, false); err != nil {
		b.Fatal(err)
	}
	e := ioengine.New(m, cfg)
	defer e.Close()
	var next, seeds atomic.Int64
	b.SetBytes(4096)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(uint64(seeds.Add(1)), 1))
		r := &ioengine.Request{Op: op, Length: 4096, Data: make([]byte, 4096)}
		for pb.Next() {
			if seq {
				r.Offset = (next.Add(4096) - 4096) % size
			} else {
				r.Offset = rng.Int64N(size/4096) * 4096
			}
			if err := e.Do(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	s := e.Stats()
	b.ReportMetric(s.MergeRatio(), "merge-ratio")
	if op == ioengine.OpWrite {
		b.ReportMetric(s.MeanWriteSize(), "B/backend-write")
	}
}

func BenchmarkEngineSeqWrite4K(b *testing.B) { benchEngine(b, ioengine.OpWrite, true) }

// BenchmarkEngineSeqWrite4KNoGather is the comparison for gathering: only
// what happens to be queued merges.
func BenchmarkEngineSeqWrite4KNoGather(b *testing.B) {
	benchEngineCfg(b, ioengine.OpWrite, true, ioengine.Config{GatherDelay: -1})
}
func BenchmarkEngineRandWrite4K(b *testing.B) { benchEngine(b, ioengine.OpWrite, false) }
func BenchmarkEngineRandRead4K(b *testing.B)  { benchEngine(b, ioengine.OpRead, false) }

func BenchmarkEngineSeqRead4K(b *testing.B) { benchEngine(b, ioengine.OpRead, true) }
