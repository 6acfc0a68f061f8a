package driver

import (
	"bytes"
	"fmt"
	"syscall"

	"github.com/vmsan/vmsan/internal/export"
)

// Read-modify-write requests (COMPARE AND WRITE, ORWRITE) on a replicated
// volume: the local engine would execute them atomically, but replication
// mirrors primitive writes, so the replica runs their steps itself (read
// locally, compare or OR, propose the write) under a range lock kept by
// the loop, which sees every client write of the volume (all front ends
// submit through wrapped devices):
//
//   - the lock is granted once no client write overlapping it is in
//     flight (proposed and not released), so the read sees every write
//     submitted before it;
//   - while it is requested or held, client writes overlapping it (or
//     overlapping a write already deferred, so overlapping writes keep
//     their order) are deferred in the loop, and proposed, in order, when
//     it is released; the request's own write passes.
//
// INVARIANT: no client write overlapping a held range lock is proposed
// between the grant and the release, whatever front end sent it.
//
// Nothing here blocks the loop: the steps run on a goroutine of their own,
// waiting for grants and completions on channels.

// rmwLock is one range lock. Loop-owned except granted, which the
// requester waits on.
type rmwLock struct {
	off, end int64
	granted  chan struct{}
	isGrant  bool
}

func overlaps(off, end int64, r *export.Request) bool {
	return r.Offset < end && off < r.Offset+r.Length
}

func modifying(r *export.Request) bool {
	switch r.Op {
	case export.OpWrite, export.OpTrim, export.OpWriteZeroes:
		return true
	}
	return false
}

// rmwDefer reports whether a client proposal must wait for a range lock
// (and queues it). REQUIRES: loop goroutine.
//
// The owner's own write always passes: the writes deferred behind its lock
// were all sent after the grant (a lock is granted only with none
// overlapping deferred), so they are ordered after it anyway.
func (r *Replica) rmwDefer(req *export.Request, owner *rmwLock) bool {
	if owner != nil || len(r.rmwLocks) == 0 && len(r.rmwDeferred) == 0 || !modifying(req) {
		return false
	}
	for _, l := range r.rmwLocks {
		if overlaps(l.off, l.end, req) {
			r.rmwDeferred = append(r.rmwDeferred, req)
			return true
		}
	}
	for _, d := range r.rmwDeferred {
		if overlaps(d.Offset, d.Offset+d.Length, req) {
			r.rmwDeferred = append(r.rmwDeferred, req)
			return true
		}
	}
	return false
}

// rmwGrant grants every requested lock that nothing in flight, deferred
// or already granted overlaps. REQUIRES: loop goroutine.
func (r *Replica) rmwGrant() {
	for i, l := range r.rmwLocks {
		if l.isGrant {
			continue
		}
		ok := true
		for _, o := range r.rmwLocks[:i] {
			if o.off < l.end && l.off < o.end {
				ok = false // an earlier lock on the range goes first
				break
			}
		}
		for _, c := range r.clients {
			if !ok {
				break
			}
			if modifying(c) && overlaps(l.off, l.end, c) {
				ok = false
			}
		}
		for _, d := range r.rmwDeferred {
			if !ok {
				break
			}
			if overlaps(l.off, l.end, d) {
				ok = false
			}
		}
		if ok {
			l.isGrant = true
			close(l.granted)
		}
	}
}

// rmwRelease drops l and proposes the deferred writes it no longer holds
// back, in order. REQUIRES: loop goroutine.
func (r *Replica) rmwRelease(l *rmwLock) {
	for i, o := range r.rmwLocks {
		if o == l {
			r.rmwLocks = append(r.rmwLocks[:i], r.rmwLocks[i+1:]...)
			break
		}
	}
	pending := r.rmwDeferred
	r.rmwDeferred = nil
	for _, req := range pending {
		r.propose(req, nil)
	}
	r.rmwGrant()
}

// rmwFail finishes every deferred write with err and wakes every lock
// waiter (their steps then fail on the stopped replica). REQUIRES: loop
// goroutine.
func (r *Replica) rmwFail(err error) {
	for _, req := range r.rmwDeferred {
		finish(req, err)
	}
	r.rmwDeferred = nil
	for _, l := range r.rmwLocks {
		if !l.isGrant {
			l.isGrant = true
			close(l.granted)
		}
	}
	r.rmwLocks = nil
}

// onLoop runs fn on the loop goroutine (false: the replica stopped).
func (r *Replica) onLoop(fn func()) bool {
	select {
	case r.events <- event{kind: evFn, fn: fn}:
		return true
	case <-r.done:
		return false
	}
}

var errStopped = fmt.Errorf("repl: replica stopped: %w", syscall.EIO)

// readModifyWrite runs an OpCompareWrite or OpOrWrite on the replicated
// volume under a range lock (see above), on a goroutine of its own; local
// is the client's own reference to the volume's engine (its reads).
func (r *Replica) readModifyWrite(local export.Device, req *export.Request) {
	go func() { finish(req, r.rmwSteps(local, req)) }()
}

func (r *Replica) rmwSteps(local export.Device, req *export.Request) error {
	l := &rmwLock{off: req.Offset, end: req.Offset + req.Length, granted: make(chan struct{})}
	if !r.onLoop(func() { r.rmwLocks = append(r.rmwLocks, l); r.rmwGrant() }) {
		return errStopped
	}
	select {
	case <-l.granted:
	case <-r.done:
		return errStopped
	}
	defer r.onLoop(func() { r.rmwRelease(l) })
	ch := make(chan struct{}, 1)
	n := req.Length
	cur := req.Aux[:n]
	rd := &export.Request{Op: export.OpRead, Offset: req.Offset, Length: n, Data: cur, Done: func(*export.Request) { ch <- struct{}{} }}
	r.submitClient(local, rd)
	<-ch
	if rd.Err != nil {
		return rd.Err
	}
	data := cur
	if req.Op == export.OpCompareWrite {
		if !bytes.Equal(cur, req.Data[:n]) {
			return export.ErrMiscompare
		}
		data = req.Data[n : 2*n]
	} else {
		for i, b := range req.Data[:n] {
			cur[i] |= b
		}
	}
	w := &export.Request{Op: export.OpWrite, Offset: req.Offset, Length: n, Data: data, FUA: req.FUA, Done: func(*export.Request) { ch <- struct{}{} }}
	r.waitSendRoom()
	select {
	case r.events <- event{kind: evPropose, req: w, owner: l}:
	case <-r.done:
		return errStopped
	}
	<-ch
	return w.Err
}
