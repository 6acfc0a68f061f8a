package client

import (
	"testing"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// TestBlockStatusLargeExportNbdkit maps an 8 GiB nbdkit memory export with
// one written block. nbdkit 1.32 aborts (an assertion in its block-status
// encoder) when a request asks for 0xFFFFFFFF bytes; requests of at most
// maxStatusLength must map the whole export and leave it running.
func TestBlockStatusLargeExportNbdkit(t *testing.T) {
	const size = 8 << 30
	c := dial(t, nbdkit(t, "memory", "8G"), nil)
	if !c.Export().HasAlloc {
		t.Fatal("nbdkit did not agree to base:allocation")
	}
	data := make([]byte, 64<<10)
	data[0] = 1
	if _, err := c.WriteAt(data, 5<<30); err != nil {
		t.Fatal(err)
	}
	var dataBytes int64
	for off := int64(0); off < size; {
		ex, err := c.BlockStatus(off, size-off)
		if err != nil {
			t.Fatalf("BlockStatus(%d): %v", off, err)
		}
		if len(ex) == 0 {
			t.Fatalf("BlockStatus(%d): no extents", off)
		}
		for _, e := range ex {
			if e.Offset != off || e.Length <= 0 || e.Length > maxStatusLength(c.Export().MinBlock) {
				t.Fatalf("extent %+v at %d", e, off)
			}
			if !e.Hole {
				dataBytes += e.Length
			}
			off += e.Length
		}
		if off > size {
			t.Fatalf("extents run to %d, past the export size %d", off, size)
		}
	}
	if dataBytes < int64(len(data)) {
		t.Fatalf("the written block is not reported as data (%d data bytes)", dataBytes)
	}
	// The server is still there.
	buf := make([]byte, 4096)
	if _, err := c.ReadAt(buf, 5<<30); err != nil || buf[0] != 1 {
		t.Fatalf("read after the map: %v %d", err, buf[0])
	}
}

// TestAppendExtentsClips: extents a server reports past the request (the
// spec allows the last one to run over; some servers send more) are
// clipped to the request, and descriptors after its end are dropped.
func TestAppendExtentsClips(t *testing.T) {
	hole := uint32(proto.StateHole | proto.StateZero)
	bd := func(n, f uint32) proto.BlockDescriptor { return proto.BlockDescriptor{Length: n, Flags: f} }
	cases := []struct {
		name     string
		off, len int64
		ds       []proto.BlockDescriptor
		want     []Extent
	}{
		{"within", 100, 30, []proto.BlockDescriptor{bd(10, 0), bd(20, hole)},
			[]Extent{{100, 10, false, false}, {110, 20, true, true}}},
		{"last runs over", 0, 4096, []proto.BlockDescriptor{bd(1024, 0), bd(1<<31, hole)},
			[]Extent{{0, 1024, false, false}, {1024, 3072, true, true}}},
		{"single longer than asked", 1 << 33, 1<<31 - 512, []proto.BlockDescriptor{bd(1<<32-1, hole)},
			[]Extent{{1 << 33, 1<<31 - 512, true, true}}},
		{"descriptors after the end", 0, 10, []proto.BlockDescriptor{bd(10, 0), bd(5, hole), bd(7, 0)},
			[]Extent{{0, 10, false, false}}},
	}
	for _, c := range cases {
		got := appendExtents(nil, c.off, c.len, c.ds)
		if len(got) != len(c.want) {
			t.Fatalf("%s: got %+v, want %+v", c.name, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("%s: got %+v, want %+v", c.name, got, c.want)
			}
		}
	}
}

func TestMaxStatusLength(t *testing.T) {
	for _, c := range []struct {
		min  uint32
		want int64
	}{{0, 1<<31 - 1}, {1, 1<<31 - 1}, {512, 1<<31 - 512}, {4096, 1<<31 - 4096}, {64 << 10, 1<<31 - 64<<10}} {
		if got := maxStatusLength(c.min); got != c.want {
			t.Errorf("maxStatusLength(%d) = %d, want %d", c.min, got, c.want)
		}
	}
}
