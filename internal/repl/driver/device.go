package driver

import (
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/repl"
)

// Wrap returns the device front ends should use for this volume: reads go
// straight to the local engine; writes, trims, zeroes and flushes go
// through replication (and are refused on a secondary).
//
// Every wrapped device counts as a client holding the volume open until it
// is released (the NBD server opens one per connection); Demote refuses
// while any does, unless its holder declared it follows roles
// (FollowRoles: an ALUA-aware iSCSI logical unit, drained before the
// demote). The replica's own reference (Options.Device) is not wrapped,
// so it is not counted.
func (r *Replica) Wrap(dev export.Device) export.Device {
	r.opens.Add(1)
	return &device{Device: dev, r: r}
}

type device struct {
	export.Device
	r        *Replica
	released atomic.Bool // the hold was dropped (Release or FollowRoles)
}

// FollowRoles (export.RoleFollower) drops this device's hold on the
// volume without releasing it: its holder stops writing during a role
// change on its own, so it need not block Demote.
func (d *device) FollowRoles() {
	if d.released.CompareAndSwap(false, true) {
		d.r.opens.Add(-1)
	}
}

// Release drops this client's hold (once, however often a front end calls
// it) and the underlying reference.
func (d *device) Release() {
	if d.released.CompareAndSwap(false, true) {
		d.r.opens.Add(-1)
	}
	d.Device.Release()
}

func (d *device) Info() export.Info {
	i := d.Device.Info()
	if !d.r.primary.Load() {
		// Secondaries export read-only; NBD clients then never send writes.
		i.ReadOnly = true
	}
	return i
}

var errNotUpToDate = fmt.Errorf("repl: local replica is not UpToDate (resync in progress): %w", syscall.EIO)

func (d *device) Submit(req *export.Request) { d.r.submitClient(d.Device, req) }

// submitClient routes one client request: reads to local (the client's
// own reference to the volume's engine), everything else through
// replication.
func (r *Replica) submitClient(local export.Device, req *export.Request) {
	if req.Op == export.OpCompareWrite || req.Op == export.OpOrWrite {
		// Atomic against every client write of the volume: under the
		// loop's range lock (rmw.go).
		if !r.primary.Load() {
			finish(req, mapErr(repl.ErrNotPrimary))
			return
		}
		r.readModifyWrite(local, req)
		return
	}
	if export.IsCompound(req) {
		// Replication mirrors primitive writes: a pattern write or a
		// trim list runs as its steps, each replicated (ordered as
		// separate requests; see ioengine.RunSteps).
		export.RunSteps(req, func(s *export.Request) { r.submitClient(local, s) })
		return
	}
	switch req.Op {
	case export.OpRead, export.OpCache:
		if !r.upToDate.Load() {
			finish(req, errNotUpToDate)
			return
		}
		local.Submit(req)
		return
	case export.OpWriteZeroes:
		if req.FastZero {
			// The peer's zeroing speed is unknown: NBD lets us refuse.
			finish(req, backend.ErrNotFast)
			return
		}
	}
	r.waitSendRoom()
	select {
	case r.events <- event{kind: evPropose, req: req}:
	case <-r.done:
		finish(req, fmt.Errorf("repl: replica stopped: %w", syscall.EIO))
	}
}

// waitSendRoom applies protocol-A backpressure: a client blocks while too
// much replicated data waits to be sent.
func (r *Replica) waitSendRoom() {
	r.sendMu.Lock()
	s := r.curSender
	r.sendMu.Unlock()
	if s != nil {
		s.waitBelow(sendBudgetBytes)
	}
}
