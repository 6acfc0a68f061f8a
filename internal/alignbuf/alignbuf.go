// Package alignbuf is the one pool of aligned I/O buffers: the backend's
// O_DIRECT bounce buffers and the front ends' request payloads (through
// volrt) come from the same size classes, so memory freed by one is reused
// by the other.
//
// Simplest use:
//
//	p := alignbuf.Get(n) // len(*p) == n, &(*p)[0] is 4096-aligned
//	defer alignbuf.Put(p)
//
// Buffers are pooled per power-of-two size class from 4 KiB to 32 MiB;
// larger requests are allocated and dropped on Put. A pooled buffer's
// contents are whatever its last user left: callers that need zeroes clear
// it themselves.
//
// Concurrency: Get and Put are safe for concurrent use (sync.Pool). A
// buffer belongs to whoever got it until it is Put; it must not be used
// after.
//
// Package alignbuf is a leaf: it imports nothing from the project, so the
// backend (below the runtime) and the runtime can both use it.
package alignbuf

import (
	"bytes"
	"math/bits"
	"sync"
	"unsafe"
)

// Align is the alignment of every pooled buffer: a page, which satisfies
// O_DIRECT on every device vmsan serves (4Kn included).
const Align = 4096

const (
	minClassLog = 12 // 4 KiB
	maxClassLog = 25 // 32 MiB; larger buffers are allocated and dropped
)

var pools [maxClassLog - minClassLog + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassLog {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassLog
}

// Get returns a buffer of length n starting on an Align boundary. Give the
// pointer back with Put once the data is no longer referenced.
func Get(n int) *[]byte {
	c := classOf(n)
	if c >= len(pools) {
		b := Aligned(n, Align)
		return &b
	}
	if p, ok := pools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := Aligned(1<<(c+minClassLog), Align)[:n]
	return &b
}

// Put returns a buffer obtained from Get to its pool. Buffers of no class
// (too big, or not from Get) are dropped; nil is ignored.
func Put(p *[]byte) {
	if p == nil {
		return
	}
	c := classOf(cap(*p))
	if c >= len(pools) || cap(*p) != 1<<(c+minClassLog) {
		return
	}
	pools[c].Put(p)
}

// Aligned returns a zeroed n-byte slice whose first byte's address is a
// multiple of align, as O_DIRECT requires of memory buffers; align <= 1
// means no alignment. It over-allocates by align bytes and is not pooled.
func Aligned(n, align int) []byte {
	if align <= 1 {
		return make([]byte, n)
	}
	raw := make([]byte, n+align)
	off := (align - int(uintptr(unsafe.Pointer(&raw[0]))%uintptr(align))) % align
	return raw[off : off+n : off+n]
}

// zeroPage is what IsZero compares against: bytes.Equal is vectorised, so
// comparing against a page of zeroes beats a byte or word loop.
var zeroPage [64 << 10]byte

// IsZero reports whether b is all zero bytes. It is the one zero check of
// the project (holes on reads, WRITE SAME of zeroes, resync of holes,
// sparse copies and incremental exports): here because alignbuf is a leaf
// that the backend, the runtime and the commands may all import.
func IsZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroPage))
		if !bytes.Equal(b[:n], zeroPage[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
