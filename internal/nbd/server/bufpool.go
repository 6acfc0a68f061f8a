package server

import (
	"math/bits"
	"sync"

	"github.com/vmsan/vmsan/internal/backend"
)

// Payload buffers come from per-size-class pools so that steady-state READ and
// WRITE handling allocates nothing. Every buffer starts on a 4096-byte
// boundary because the backend may use O_DIRECT, which requires aligned
// memory.

const (
	bufAlign    = 4096
	minClassLog = 12 // 4 KiB
	maxClassLog = 25 // 32 MiB; larger buffers are allocated and dropped
)

var bufPools [maxClassLog - minClassLog + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassLog {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassLog
}

// getBuf returns a pooled buffer of length n. The returned pointer must be
// given back to putBuf once the data is no longer referenced.
func getBuf(n int) *[]byte {
	c := classOf(n)
	if c >= len(bufPools) {
		b := backend.AlignedBuf(n, bufAlign)
		return &b
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := backend.AlignedBuf(1<<(c+minClassLog), bufAlign)[:n]
	return &b
}

func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	c := classOf(cap(*p))
	if c >= len(bufPools) || cap(*p) != 1<<(c+minClassLog) {
		return
	}
	bufPools[c].Put(p)
}
