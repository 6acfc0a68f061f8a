package scsi

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestFirstCommandUnitAttention: a nexus's first command gets POWER ON
// OR RESET (29/00), INQUIRY is exempt, the next command passes.
func TestFirstCommandUnitAttention(t *testing.T) {
	f := newFixture(t)
	f.good(f.n, []byte{opInquiry, 0, 0, 0, 96, 0}, nil, 96)
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x29, 0)
	f.good(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0)
}

func TestReadWriteRoundTrip(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	data := pattern(8*512, 3)
	f.good(f.n, cdb10(opWrite10, 0x08, 16, 8), data, 0)
	r := f.good(f.n, cdb10(opRead10, 0, 16, 8), nil, 8*512)
	if !bytes.Equal(r.data, data) {
		t.Fatal("read back differs")
	}
	r = f.good(f.n, cdb16(opRead16, 0, 16, 8), nil, 8*512)
	if !bytes.Equal(r.data, data) {
		t.Fatal("read16 differs")
	}
	f.good(f.n, cdb10(opSyncCache10, 0, 0, 0), nil, 0)
	f.good(f.n, cdb10(opPreFetch10, 0x02, testSize/512-8, 8), nil, 0)
	f.check(f.n, cdb16(opPreFetch16, 0, testSize/512-8, 9), nil, 0, KeyIllegalRequest, 0x21, 0)
	rc := f.good(f.n, cdb10(opReadCapacity10, 0, 0, 0), nil, 8)
	if got := binary.BigEndian.Uint32(rc.data); got != testSize/512-1 {
		t.Fatalf("last LBA %d", got)
	}
	f.check(f.n, cdb10(opRead10, 0, testSize/512, 1), nil, 512, KeyIllegalRequest, 0x21, 0)
}
