package driver

import (
	"bytes"
	"errors"
	"testing"
	"time"

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
