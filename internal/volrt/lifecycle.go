package volrt

import (
	"sync/atomic"

	"github.com/vmsan/vmsan/internal/export"
)

// Lifecycle is the handshake between a front end's submitter and the
// engine's completion callback that decides who replies to a request:
//
//   - the submitter, when the request completed before dev.Submit
//     returned (the engine ran it inline on the submitter, or a worker was
//     faster): no goroutine hand-off at all, the common case on a fast
//     backend;
//   - otherwise the completion path (typically: hand the request to the
//     connection's writer goroutine).
//
// Usage, per request (embed a Lifecycle in the front end's per-request
// struct, which the request's Done callback can reach):
//
//	if lc.Submit(dev, r, more) { reply(r) }       // submitter
//	func done(r) { if !lc.Complete() { toWriter(r) } } // r.Done
//
// INVARIANT: exactly one of the two sides sees "mine": Submit returns true
// iff Complete returned true. After Submit returns false the request
// belongs to the completion path and the submitter must not touch it; after
// Complete returns true the completion path must not touch it.
//
// A Lifecycle may be reused for the next request once the previous one is
// fully finished. Its methods are small enough to inline: this is the
// hottest path of every front end (BenchmarkPipelined4K in nbd/server).
type Lifecycle struct{ state atomic.Uint32 }

const (
	lcSubmitting uint32 = iota + 1 // submitter is inside dev.Submit
	lcEarly                        // completed before Submit returned
	lcAsync                        // Submit returned first
)

// Submit sets the engine's scheduling hints and submits r to dev. more says
// another request from the same client is already buffered (the stream
// continues at once: the engine's write gathering may hold a sequential run
// for it; see ioengine.Request.More). When nothing more is buffered an
// inline request is also Idle: the client likely waits for it (queue depth
// 1), so blocking the submitter on a slower call loses no pipelining.
//
// It returns true when r completed before dev.Submit returned: the caller
// replies. REQUIRES: r.Done calls Complete on this Lifecycle exactly once.
func (l *Lifecycle) Submit(dev export.Device, r *export.Request, more bool) (completed bool) {
	r.More = more
	r.Idle = r.Inline && !more
	l.state.Store(lcSubmitting)
	dev.Submit(r)
	return !l.state.CompareAndSwap(lcSubmitting, lcAsync)
}

// Complete is called from the request's Done callback. It returns true
// when the submitter is still inside Submit and will reply itself; false
// means the completion path owns the request (the caller must hand it on
// without blocking: it may run on an engine worker).
func (l *Lifecycle) Complete() (submitterReplies bool) {
	return l.state.CompareAndSwap(lcSubmitting, lcEarly)
}
