package scsi

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/ioengine"
)

// slowReads delays every read's completion (after the data was read),
// widening the window between COMPARE AND WRITE's read and its write.
type slowReads struct{ export.Device }

func (d slowReads) Submit(r *ioengine.Request) {
	if r.Op != ioengine.OpRead {
		d.Device.Submit(r)
		return
	}
	done := r.Done
	r.Inline = false
	r.Done = func(r *ioengine.Request) {
		go func() {
			time.Sleep(2 * time.Millisecond)
			r.Done = done
			done(r)
		}()
	}
	d.Device.Submit(r)
}

// TestCompareAndWriteAtomicAgainstWrites: a WRITE issued while a COMPARE
// AND WRITE is between its compare and its write must be ordered after it
// (or before it, making it miscompare): either way the WRITE's data is
// what remains. A WRITE slipping in between would leave the COMPARE AND
// WRITE's data instead.
func TestCompareAndWriteAtomicAgainstWrites(t *testing.T) {
	base := exporttest.NewMemDevice(t, "vol", testSize)
	f := newFixtureDev(t, base)
	f.reg.Add(slowReads{base})
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 1)
	f.ready(a)
	f.ready(b)
	A, B, C := pattern(512, 1), pattern(512, 2), pattern(512, 3)
	caw := cdb16(opCompareAndWrite, 0, 7, 0)
	caw[13] = 1
	for i := 0; i < 30; i++ {
		f.good(a, cdb10(opWrite10, 0, 7, 1), A, 0)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			f.exec(a, caw, append(append([]byte(nil), A...), B...), 0)
		}()
		time.Sleep(500 * time.Microsecond) // the CAW's read is in flight
		go func() {
			defer wg.Done()
			f.good(b, cdb10(opWrite10, 0, 7, 1), C, 0)
		}()
		wg.Wait()
		if got := f.good(a, cdb10(opRead10, 0, 7, 1), nil, 512).data; !bytes.Equal(got, C) {
			t.Fatalf("round %d: a WRITE was overwritten by a COMPARE AND WRITE it overlapped (got pattern %d)", i, got[0])
		}
	}
}

// TestCompareAndWriteCounter: concurrent read-modify-write increments
// through COMPARE AND WRITE never lose an update.
func TestCompareAndWriteCounter(t *testing.T) {
	f := newFixture(t)
	const workers, incs = 4, 25
	ns := make([]*Nexus, workers)
	for i := range ns {
		ns[i] = nexus("iqn.w"+string(rune('a'+i)), 1)
		f.ready(ns[i])
	}
	f.good(ns[0], cdb10(opWrite10, 0, 3, 1), make([]byte, 512), 0)
	caw := cdb16(opCompareAndWrite, 0, 3, 0)
	caw[13] = 1
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(n *Nexus) {
			defer wg.Done()
			for done := 0; done < incs; {
				cur := execOn(t, f.tg, n, 0, cdb10(opRead10, 0, 3, 1), nil, 512).data
				next := append([]byte(nil), cur...)
				v := uint32(next[0]) | uint32(next[1])<<8
				v++
				next[0], next[1] = byte(v), byte(v>>8)
				r := execOn(t, f.tg, n, 0, caw, append(cur, next...), 0)
				if r.status == StatusGood {
					done++
				}
			}
		}(ns[w])
	}
	wg.Wait()
	d := f.good(ns[0], cdb10(opRead10, 0, 3, 1), nil, 512).data
	if v := int(d[0]) | int(d[1])<<8; v != workers*incs {
		t.Fatalf("counter %d, want %d", v, workers*incs)
	}
}
