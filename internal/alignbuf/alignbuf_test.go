package alignbuf

import (
	"testing"
	"unsafe"
)

func TestGetAlignedAndSized(t *testing.T) {
	for _, n := range []int{1, 512, 4096, 4097, 65536, 1 << 20, 33 << 20} {
		p := Get(n)
		if len(*p) != n {
			t.Fatalf("Get(%d): len %d", n, len(*p))
		}
		if a := uintptr(unsafe.Pointer(&(*p)[0])) % Align; a != 0 {
			t.Fatalf("Get(%d): misaligned by %d", n, a)
		}
		Put(p)
	}
	Put(nil)
}

func TestPutGetReuses(t *testing.T) {
	// sync.Pool may drop entries (GC), so only check steady state does not
	// allocate per call, which is what the hot path relies on.
	p := Get(8192)
	Put(p)
	allocs := testing.AllocsPerRun(100, func() { Put(Get(8192)) })
	if allocs > 0.5 {
		t.Fatalf("Get/Put allocates %.1f per call", allocs)
	}
}

func TestAlignedZeroed(t *testing.T) {
	b := Aligned(10000, 4096)
	if len(b) != 10000 || uintptr(unsafe.Pointer(&b[0]))%4096 != 0 {
		t.Fatal("bad Aligned")
	}
	for _, c := range b {
		if c != 0 {
			t.Fatal("not zeroed")
		}
	}
	if len(Aligned(7, 1)) != 7 {
		t.Fatal("align 1")
	}
}

func TestIsZero(t *testing.T) {
	// Lengths around the comparison page, and a non-zero byte at the
	// first, last and a middle position of each (a page boundary too).
	for _, n := range []int{0, 1, 7, 8, 4096, 64<<10 - 1, 64 << 10, 64<<10 + 1, 200 << 10} {
		b := make([]byte, n)
		if !IsZero(b) {
			t.Fatalf("IsZero(%d zeroes) = false", n)
		}
		for _, i := range []int{0, n / 2, 64 << 10, n - 1} {
			if i < 0 || i >= n {
				continue
			}
			b[i] = 1
			if IsZero(b) {
				t.Fatalf("IsZero(len %d, byte %d set) = true", n, i)
			}
			b[i] = 0
		}
	}
}
