package driver

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
)

// TestCompoundRequestsReplicated: the compound requests a SCSI front end
// submits (pattern write, trim list, compare-and-write, or-write) reach
// both replicas through the wrapped device, and a miscompare writes
// nothing.
func TestCompoundRequestsReplicated(t *testing.T) {
	a, b := pair(t, 8<<20, "C")
	waitFor(t, "connect", 10*time.Second, connected(a))
	waitFor(t, "connect", 10*time.Second, connected(b))
	do := func(r export.Request) error {
		done := make(chan error, 1)
		r.Done = func(r *export.Request) { done <- r.Err }
		a.front.Submit(&r)
		return <-done
	}
	if err := do(export.Request{Op: export.OpWriteRepeat, Offset: 0, Length: 3 << 20, Data: bytes.Repeat([]byte{0xAB, 0xCD}, 256<<10)}); err != nil {
		t.Fatal(err)
	}
	if err := do(export.Request{Op: export.OpTrim, Offset: 4096, Length: 1 << 20, Ranges: []export.Range{{Offset: 4096, Length: 4096}, {Offset: 1<<20 + 4096 - 8192, Length: 8192}}}); err != nil {
		t.Fatal(err)
	}
	aux := make([]byte, 512)
	if err := do(export.Request{Op: export.OpCompareWrite, Offset: 6 << 20, Length: 512, Data: append(make([]byte, 512), bytes.Repeat([]byte{7}, 512)...), Aux: aux}); err != nil {
		t.Fatal(err)
	}
	err := do(export.Request{Op: export.OpCompareWrite, Offset: 6 << 20, Length: 512, Data: append(make([]byte, 512), bytes.Repeat([]byte{9}, 512)...), Aux: aux})
	if !errors.Is(err, export.ErrMiscompare) {
		t.Fatalf("compare-and-write with stale data: %v, want ErrMiscompare", err)
	}
	if err := do(export.Request{Op: export.OpOrWrite, Offset: 6 << 20, Length: 512, Data: bytes.Repeat([]byte{0x30}, 512), Aux: aux}); err != nil {
		t.Fatal(err)
	}
	if err := a.do(export.OpFlush, 0, nil, 0); err != nil {
		t.Fatal(err)
	}
	if a.sum() != b.sum() {
		t.Fatal("replicas differ after compound requests and a protocol C flush")
	}
	got := make([]byte, 512)
	if err := a.dev.eng.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: 6 << 20, Length: 512, Data: got}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x37}, 512)) {
		t.Fatalf("compare-and-write then or-write left %#x, want 0x37", got[0])
	}
}

// slowReads delays every backend read: a read-modify-write's read takes
// long enough for another client's write to arrive during it. Each read
// signals reading as it starts, so the test sends that write once the
// read is in flight rather than after a guessed sleep.
type slowReads struct {
	backend.Backend
	reading chan struct{}
}

func (b slowReads) ReadvAt(bufs [][]byte, off int64) error {
	select {
	case b.reading <- struct{}{}:
	default: // a signal is pending already
	}
	time.Sleep(2 * time.Millisecond)
	return b.Backend.ReadvAt(bufs, off)
}

// TestCompareWriteAtomicReplicated: on a replicated primary, a
// compare-and-write is atomic against writes of other clients (another
// wrapped device: an NBD connection, another iSCSI session): a write sent
// while the compare-and-write reads is ordered before it (miscompare) or
// after it; either way its data is what remains, on both replicas.
func TestCompareWriteAtomicReplicated(t *testing.T) {
	aAddr, bAddr := freeAddr(t), freeAddr(t)
	base := t.TempDir()
	set := Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)}
	sa, sb := set, set
	sa.Listen, sa.Peer, sa.NodeID, sa.Role, sa.Dial = aAddr, bAddr, 1, "primary", "yes"
	sb.Listen, sb.Peer, sb.NodeID, sb.Role, sb.Dial = bAddr, aAddr, 2, "secondary", "no"
	os.MkdirAll(filepath.Join(base, "a"), 0o755)
	os.MkdirAll(filepath.Join(base, "b"), 0o755)
	reading := make(chan struct{}, 1)
	a := newNode(t, filepath.Join(base, "a"), 4<<20, sa, func(b backend.Backend) backend.Backend { return slowReads{b, reading} })
	b := newNode(t, filepath.Join(base, "b"), 4<<20, sb, nil)
	t.Cleanup(func() { a.stop(); b.stop() })
	waitFor(t, "connect", 10*time.Second, connected(a))
	waitFor(t, "connect", 10*time.Second, connected(b))
	other := a.r.Wrap(a.dev)
	defer other.Release()
	const off, n = 64 << 10, 4096
	A, B, C := pattern(1, n), pattern(2, n), pattern(3, n)
	good, mis := 0, 0
	for i := 0; i < 20; i++ {
		if err := a.write(off, A); err != nil {
			t.Fatal(err)
		}
		cr := make(chan error, 1)
		select { // forget an earlier read's signal: no read is in flight
		case <-reading:
		default:
		}
		caw := &export.Request{Op: export.OpCompareWrite, Offset: off, Length: n, Data: append(append([]byte(nil), A...), B...), Aux: make([]byte, n),
			Done: func(r *export.Request) { cr <- r.Err }}
		a.front.Submit(caw)
		select { // the compare-and-write's read is in flight
		case <-reading:
		case <-time.After(10 * time.Second):
			t.Fatal("the compare-and-write did not read")
		}
		wr := make(chan error, 1)
		other.Submit(&export.Request{Op: export.OpWrite, Offset: off, Length: n, Data: C, Done: func(r *export.Request) { wr <- r.Err }})
		if err := <-wr; err != nil {
			t.Fatal(err)
		}
		switch err := <-cr; {
		case err == nil:
			good++
		case errors.Is(err, export.ErrMiscompare):
			mis++
		default:
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := a.dev.eng.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: off, Length: n, Data: got}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, C) {
			t.Fatalf("round %d: a write sent during a compare-and-write was lost (pattern %d remains)", i, got[0])
		}
	}
	if err := a.do(export.OpFlush, 0, nil, 0); err != nil {
		t.Fatal(err)
	}
	if a.sum() != b.sum() {
		t.Fatal("replicas differ")
	}
	t.Logf("%d compare-and-writes before the other write, %d after it (miscompare)", good, mis)
}
