package driver

import (
	"crypto/sha256"
	"sync"

	"github.com/vmsan/vmsan/internal/alignbuf"
	"github.com/vmsan/vmsan/internal/repl"
)

// fifo is an unbounded queue with a blocking pop; safe for several
// producers and consumers.
type fifo[T any] struct {
	mu   sync.Mutex
	q    []T
	wake chan struct{}
}

func (f *fifo[T]) init() { f.wake = make(chan struct{}, 1) }

func (f *fifo[T]) push(v T) {
	f.mu.Lock()
	f.q = append(f.q, v)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fifo[T]) pop(stop <-chan struct{}) (T, bool) {
	for {
		f.mu.Lock()
		if len(f.q) > 0 {
			v := f.q[0]
			var zero T
			f.q[0] = zero
			f.q = f.q[1:]
			more := len(f.q) > 0
			f.mu.Unlock()
			if more {
				// Pass the wake-up on, for queues with several consumers.
				select {
				case f.wake <- struct{}{}:
				default:
				}
			}
			return v, true
		}
		f.mu.Unlock()
		select {
		case <-f.wake:
		case <-stop:
			var zero T
			return zero, false
		}
	}
}

type completion struct {
	id     uint64
	err    error
	bytes  int64
	read   bool
	pieces []repl.ReadPiece
	rxBuf  []byte // a received payload to recycle once the node has seen the completion
}

// compQueue collects completions from engine callbacks without ever
// blocking them (engine Done callbacks must be quick).
type compQueue struct {
	mu     sync.Mutex
	q      []completion
	notify chan struct{}
}

func (c *compQueue) init() { c.notify = make(chan struct{}, 1) }

func (c *compQueue) push(v completion) {
	c.mu.Lock()
	c.q = append(c.q, v)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *compQueue) take() []completion {
	c.mu.Lock()
	q := c.q
	c.q = nil
	c.mu.Unlock()
	return q
}

func hashOf(b []byte) [repl.HashSize]byte { return sha256.Sum256(b) }

var (
	zeroMu    sync.Mutex
	zeroCache = map[int64][repl.HashSize]byte{}
)

// zeroHash is the hash of length zero bytes, so a hole here matches
// written zeroes on the peer. Cached: resync sees few distinct lengths.
func zeroHash(length int64) [repl.HashSize]byte {
	zeroMu.Lock()
	defer zeroMu.Unlock()
	if h, ok := zeroCache[length]; ok {
		return h
	}
	hs := sha256.New()
	z := make([]byte, min(length, 1<<20))
	for left := length; left > 0; left -= int64(len(z)) {
		hs.Write(z[:min(int64(len(z)), left)])
	}
	var h [repl.HashSize]byte
	copy(h[:], hs.Sum(nil))
	if len(zeroCache) < 64 {
		zeroCache[length] = h
	}
	return h
}

// Receive buffers come from the project's one pool of I/O buffers
// (alignbuf, shared with the backend's bounce buffers and the front ends'
// payloads): a secondary under a 4 KiB random-write stream would otherwise
// allocate (and the GC scan) one buffer per replicated write. They are
// page-aligned, so an O_DIRECT backend writes them without a bounce copy.

// getRxBuf returns a buffer of length n (pooled up to alignbuf's largest
// class).
func getRxBuf(n int) []byte { return *alignbuf.Get(n) }

// putRxBuf recycles a buffer from getRxBuf.
//
// REQUIRES: nothing references b any more (for a stream apply: its
// LocalDone has been reported to the node).
func putRxBuf(b []byte) {
	if cap(b) == 0 {
		return
	}
	alignbuf.Put(&b)
}
