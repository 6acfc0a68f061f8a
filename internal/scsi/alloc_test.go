package scsi

import (
	"testing"

	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// TestReadWriteAllocs: steady-state READ/WRITE through Execute (pooled
// command, Result, engine request and data buffer) allocates nothing per
// command beyond what the engine itself does; nor do the commands run as
// one compound engine request (pattern WRITE SAME, UNMAP's range list,
// COMPARE AND WRITE, ORWRITE).
func TestReadWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates") // skip: race
	}
	f := newFixture(t)
	luns := []LUN{{0, "vol"}}
	f.tg = New(Config{Registry: f.reg, LUNs: func() []LUN { return luns }})
	t.Cleanup(f.tg.Close)
	f.ready(f.n)
	data := pattern(4096, 1)
	rd := &Task{Nexus: f.n, CDB: cdb10(opRead10, 0, 8, 8), ExpectedIn: 4096}
	wr := &Task{Nexus: f.n, CDB: cdb10(opWrite10, 0, 8, 8), DataOut: data, ExpectedOut: 4096}
	ws := &Task{Nexus: f.n, CDB: cdb16(opWriteSame16, 0, 64, 16), DataOut: pattern(512, 3), ExpectedOut: 512}
	um := make([]byte, 8+2*16)
	um[1], um[3] = byte(len(um)-2), 32
	um[8+7], um[8+11] = 100, 4   // LBA 100, 4 blocks
	um[24+7], um[24+11] = 200, 4 // LBA 200, 4 blocks
	unmap := &Task{Nexus: f.n, CDB: cdb10(opUnmap, 0, 0, uint16(len(um))), DataOut: um, ExpectedOut: uint32(len(um))}
	cawCDB := cdb16(opCompareAndWrite, 0, 300, 0)
	cawCDB[13] = 1
	same := pattern(512, 5)
	caw := &Task{Nexus: f.n, CDB: cawCDB, DataOut: append(append([]byte(nil), same...), same...), ExpectedOut: 1024}
	orw := &Task{Nexus: f.n, CDB: cdb16(opORWrite, 0, 400, 1), DataOut: pattern(512, 6), ExpectedOut: 512}
	f.good(f.n, cdb10(opWrite10, 0, 300, 1), same, 0)
	done := make(chan struct{}, 1)
	var status uint8
	cb := func(r *Result) {
		status = r.Status
		r.Release()
		done <- struct{}{}
	}
	for _, tc := range []struct {
		name string
		task *Task
	}{{"read", rd}, {"write", wr}, {"write same", ws}, {"unmap", unmap}, {"compare and write", caw}, {"orwrite", orw}} {
		avg := testing.AllocsPerRun(200, func() {
			f.tg.Execute(tc.task, cb)
			<-done
		})
		if status != StatusGood {
			t.Fatalf("%s: status %#x", tc.name, status)
		}
		t.Logf("%s: %.2f allocs per command", tc.name, avg)
		if avg > 1 {
			t.Errorf("%s: %.2f allocations per command", tc.name, avg)
		}
	}
}

// BenchmarkExecuteRead4K: one 4 KiB READ(10) through Execute (lookup,
// unit attention and reservation fast paths, engine inline) per op.
func BenchmarkExecuteRead4K(b *testing.B) {
	benchExecute(b, false)
}

// BenchmarkExecuteWrite4K: the same for WRITE(10).
func BenchmarkExecuteWrite4K(b *testing.B) {
	benchExecute(b, true)
}

func benchExecute(b *testing.B, write bool) {
	dev := exporttest.NewMemDevice(b, "vol", 64<<20)
	reg := exporttest.NewRegistry(dev)
	luns := []LUN{{0, "vol"}}
	tg := New(Config{Registry: reg, LUNs: func() []LUN { return luns }})
	b.Cleanup(tg.Close)
	n := nexus("iqn.bench", 1)
	done := make(chan uint8, 1)
	cb := func(r *Result) {
		s := r.Status
		r.Release()
		done <- s
	}
	tg.Execute(&Task{Nexus: n, CDB: []byte{opTestUnitReady, 0, 0, 0, 0, 0}}, cb)
	<-done
	tg.Execute(&Task{Nexus: n, CDB: cdb10(opWrite10, 0, 0, 8192), DataOut: make([]byte, 4<<20), ExpectedOut: 4 << 20}, cb)
	<-done
	task := &Task{Nexus: n, CDB: cdb10(opRead10, 0, 0, 8), ExpectedIn: 4096}
	if write {
		task = &Task{Nexus: n, CDB: cdb10(opWrite10, 0, 0, 8), DataOut: pattern(4096, 1), ExpectedOut: 4096}
	}
	b.SetBytes(4096)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		// Scattered 4 KiB blocks over 4 MiB (backend.Mem pages allocated
		// once): a sequential stream would measure the engine's
		// write-gathering hold, first writes Mem's page allocation.
		lba := uint32(i*7919*8) % (4 << 20 / 512)
		task.CDB[2], task.CDB[3], task.CDB[4], task.CDB[5] = byte(lba>>24), byte(lba>>16), byte(lba>>8), byte(lba)
		tg.Execute(task, cb)
		if s := <-done; s != StatusGood {
			b.Fatalf("status %#x", s)
		}
	}
	b.StopTimer()
	st := dev.Engine.Stats()
	b.Logf("inlined %d of %d requests", st.Inlined, st.Requests.Read+st.Requests.Write)
}
