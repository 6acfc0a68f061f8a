package volrt

import "sync"

// Budget bounds the payload bytes a connection holds in flight (read
// buffers waiting to be sent, write payloads waiting to be applied), so a
// client cannot make the server hold unbounded memory.
//
// Concurrency: safe for concurrent use. The zero value is not usable; call
// Init.
type Budget struct {
	mu    sync.Mutex
	cond  sync.Cond
	used  int64
	limit int64
}

// Init sets the limit (bytes). Call before any Reserve.
func (b *Budget) Init(limit int64) {
	b.limit = limit
	b.cond.L = &b.mu
}

// Reserve blocks until n bytes fit in the budget. A single request larger
// than the whole budget is admitted when nothing else is held, so progress
// is always possible.
func (b *Budget) Reserve(n int64) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

// Release gives back n bytes taken by Reserve.
func (b *Budget) Release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// Used is the number of bytes currently reserved.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
