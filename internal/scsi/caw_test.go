package scsi

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
)

// TestCompareAndWriteAtomicAgainstWrites: a WRITE issued while a COMPARE
// AND WRITE is between its compare and its write must be ordered after it
// (or before it, making it miscompare): either way the WRITE's data is
// what remains. A WRITE slipping in between would leave the COMPARE AND
// WRITE's data instead.
func TestCompareAndWriteAtomicAgainstWrites(t *testing.T) {
	be := newSlowRead()
	f := newFixtureDev(t, exporttest.NewDevice(t, "vol", be))
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
		be.drain()
		go func() {
			defer wg.Done()
			f.exec(a, caw, append(append([]byte(nil), A...), B...), 0)
		}()
		be.waitRead(t) // the CAW's read is in flight
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

// slowReadBackend delays every backend read: a COMPARE AND WRITE's read
// takes long enough for a write from another front end to arrive during
// it. Each read, as it starts, signals reading, so a test sends its write
// once the read is in flight (waitRead) instead of after a guessed sleep.
type slowReadBackend struct {
	backend.Backend
	reading chan struct{}
}

func newSlowRead() slowReadBackend {
	return slowReadBackend{Backend: backend.NewMem(testSize), reading: make(chan struct{}, 1)}
}

func (b slowReadBackend) ReadvAt(bufs [][]byte, off int64) error {
	select {
	case b.reading <- struct{}{}:
	default: // a signal is pending already
	}
	time.Sleep(2 * time.Millisecond)
	return b.Backend.ReadvAt(bufs, off)
}

// drain forgets the signal of an earlier read (REQUIRES: no read in
// flight).
func (b slowReadBackend) drain() {
	select {
	case <-b.reading:
	default:
	}
}

// waitRead waits until a read has started since the last drain.
func (b slowReadBackend) waitRead(t *testing.T) {
	t.Helper()
	select {
	case <-b.reading:
	case <-time.After(10 * time.Second):
		t.Fatal("no backend read started")
	}
}

// TestCompareAndWriteAtomicAgainstNBD: COMPARE AND WRITE is atomic against
// every front end of the volume, not only writes of its logical unit: an
// NBD write to the same blocks, sent while the COMPARE AND WRITE is
// reading, is ordered before it (it miscompares) or after it; either way
// the NBD write's data is what remains, whole (8 blocks, never a mix of
// the two writes). A write slipping in between the compare and the write
// would leave the COMPARE AND WRITE's data.
func TestCompareAndWriteAtomicAgainstNBD(t *testing.T) {
	be := newSlowRead()
	dev := exporttest.NewDevice(t, "vol", be)
	dev.Meta.MaxBlock = 1 << 20
	f := newFixtureDev(t, dev)
	_, sock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := client.Dial(ctx, "nbd+unix:///vol?socket="+sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	a := nexus("iqn.a", 1)
	f.ready(a)
	const blocks, lba = 8, 7
	A, B, C := pattern(blocks*512, 1), pattern(blocks*512, 2), pattern(blocks*512, 3)
	caw := cdb16(opCompareAndWrite, 0, lba, 0)
	caw[13] = blocks
	good, miscompares := 0, 0
	for i := 0; i < 30; i++ {
		f.good(a, cdb10(opWrite10, 0, lba, blocks), A, 0)
		cr := make(chan res, 1)
		be.drain()
		go func() { cr <- f.exec(a, caw, append(append([]byte(nil), A...), B...), 0) }()
		be.waitRead(t) // the COMPARE AND WRITE's read is in flight
		if _, err := nc.WriteAt(C, lba*512); err != nil {
			t.Fatal(err)
		}
		r := <-cr
		switch k, asc, _ := r.kcq(); {
		case r.status == StatusGood:
			good++
		case r.status == StatusCheckCondition && k == KeyMiscompare && asc == 0x1D:
			miscompares++
		default:
			t.Fatalf("round %d: COMPARE AND WRITE status %#x sense %x/%02x", i, r.status, k, asc)
		}
		if got := f.good(a, cdb10(opRead10, 0, lba, blocks), nil, blocks*512).data; !bytes.Equal(got, C) {
			t.Fatalf("round %d: an NBD write sent during a COMPARE AND WRITE was lost or torn (block 0 has pattern %d, last block %d)",
				i, got[0], got[len(got)-512])
		}
	}
	t.Logf("%d COMPARE AND WRITEs ordered before the NBD write, %d after it (miscompare)", good, miscompares)
}
