package driver

import (
	"math/rand/v2"
	"testing"

	"github.com/vmsan/vmsan/internal/export"
)

// BenchmarkReplicatedWrite1M: 1 MiB writes at queue depth 8 through a
// protocol C pair on loopback (in one process).
func BenchmarkReplicatedWrite1M(b *testing.B) {
	benchWrite(b, 1<<20, 8)
}

// BenchmarkReplicatedWrite4K: 4 KiB writes at queue depth 32.
func BenchmarkReplicatedWrite4K(b *testing.B) { benchWrite(b, 4<<10, 32) }

// BenchmarkReplicatedRandWrite4K: 4 KiB writes at random 4 KiB-aligned
// offsets over 200 MiB, queue depth 32 (what fio randwrite does).
func BenchmarkReplicatedRandWrite4K(b *testing.B) { benchWriteAt(b, 4<<10, 32, true) }

func benchWrite(b *testing.B, size int64, qd int) { benchWriteAt(b, size, qd, false) }

func benchWriteAt(b *testing.B, size int64, qd int, random bool) {
	a, _ := pairB(b, 256<<20)
	data := pattern(1, int(size))
	errs := make(chan error, qd)
	inflight := 0
	rng := rand.New(rand.NewPCG(1, 2))
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if inflight == qd {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			inflight--
		}
		off := (int64(i) * size) % (200 << 20)
		if random {
			off = rng.Int64N((200<<20)/size) * size
		}
		a.front.Submit(&export.Request{Op: export.OpWrite, Offset: off, Length: size, Data: data, Done: func(r *export.Request) { errs <- r.Err }})
		inflight++
	}
	for ; inflight > 0; inflight-- {
		<-errs
	}
}

// BenchmarkLocalWrite1M is the unreplicated baseline: the same writes
// straight to one engine.
func BenchmarkLocalWrite1M(b *testing.B) {
	a, _ := pairB(b, 256<<20)
	size, qd := int64(1<<20), 8
	data := pattern(1, int(size))
	errs := make(chan error, qd)
	inflight := 0
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if inflight == qd {
			<-errs
			inflight--
		}
		off := (int64(i) * size) % (200 << 20)
		a.dev.Submit(&export.Request{Op: export.OpWrite, Offset: off, Length: size, Data: data, Done: func(r *export.Request) { errs <- r.Err }})
		inflight++
	}
	for ; inflight > 0; inflight-- {
		<-errs
	}
}
