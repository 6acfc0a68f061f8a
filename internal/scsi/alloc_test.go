package scsi

import (
	"testing"
)

// TestReadWriteAllocs: steady-state READ/WRITE through Execute (pooled
// command, Result, engine request and data buffer) allocates nothing per
// command beyond what the engine itself does.
func TestReadWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	f := newFixture(t)
	luns := []LUN{{0, "vol"}}
	f.tg = New(Config{Registry: f.reg, LUNs: func() []LUN { return luns }})
	t.Cleanup(f.tg.Close)
	f.ready(f.n)
	data := pattern(4096, 1)
	rd := &Task{Nexus: f.n, CDB: cdb10(opRead10, 0, 8, 8), ExpectedIn: 4096}
	wr := &Task{Nexus: f.n, CDB: cdb10(opWrite10, 0, 8, 8), DataOut: data, ExpectedOut: 4096}
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
	}{{"read", rd}, {"write", wr}} {
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
