package driver

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/export"
)

// route is the plugin's per-volume switch between the volume's engine and
// its replica: every device a front end holds for the volume goes through
// it (Plugin.WrapDevice wraps every volume, replicated or not), so that
// replication can be added, reconfigured or removed on a running daemon
// without the clients reconnecting. While the replica changes, the route
// is paused: client requests are held (queued, their submitters never
// block, so a Done callback that submits again cannot deadlock the
// change) and handed to the new target on resume, in order. What is held is
// bounded by the clients' windows: a request held is one not answered, and
// every front end bounds its requests in flight (per connection, and the
// daemon's in-flight budget).
type route struct {
	// cur is the volume's replica; nil: not replicated (requests go
	// straight to the engine).
	cur atomic.Pointer[Replica]
	// opens counts the client devices holding the volume open (not
	// released, not role-following): the replicas' Demote check, kept
	// across replica restarts (Options.Opens).
	opens atomic.Int64

	// active counts Submit calls between their check of paused and their
	// hand-off to the target. INVARIANT: once pause has set paused and
	// seen active at 0, no request reaches the old target (both are
	// sequentially consistent atomics: a submitter either sees paused or
	// is counted in active).
	active atomic.Int64
	paused atomic.Bool

	mu   sync.Mutex // held requests
	held []heldReq
}

type heldReq struct {
	local export.Device
	req   *export.Request
}

// submit routes one client request from local (the client's own
// reference to the volume).
func (rt *route) submit(local export.Device, req *export.Request) {
	for {
		rt.active.Add(1)
		if !rt.paused.Load() {
			if r := rt.cur.Load(); r != nil {
				r.submitClient(local, req)
			} else {
				local.Submit(req)
			}
			rt.active.Add(-1)
			return
		}
		rt.active.Add(-1)
		rt.mu.Lock()
		if rt.paused.Load() {
			rt.held = append(rt.held, heldReq{local, req})
			rt.mu.Unlock()
			return
		}
		rt.mu.Unlock() // resumed meanwhile: route it now
	}
}

// pause holds new client requests and waits for the submitters already
// past the check (a bounded wait: a replica's Submit only queues, or waits
// for send room that its sender frees).
// REQUIRES: the caller serialises pause/resume (Plugin.lifeMu).
func (rt *route) pause(timeout time.Duration) error {
	rt.paused.Store(true)
	deadline := time.Now().Add(timeout)
	for rt.active.Load() > 0 {
		if time.Now().After(deadline) {
			rt.resume()
			return fmt.Errorf("client requests still being submitted after %v", timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// resume routes to r (nil: the engine) and submits the held requests,
// oldest first, before new ones flow again.
func (rt *route) resume() {
	for {
		rt.mu.Lock()
		q := rt.held
		rt.held = nil
		if len(q) == 0 {
			rt.paused.Store(false)
			rt.mu.Unlock()
			return
		}
		rt.mu.Unlock()
		for _, h := range q {
			if r := rt.cur.Load(); r != nil {
				r.submitClient(h.local, h.req)
			} else {
				h.local.Submit(h.req)
			}
		}
	}
}

// failHeld fails every held request (the volume was deleted while the
// route was paused).
func (rt *route) failHeld(err error) {
	rt.mu.Lock()
	q := rt.held
	rt.held = nil
	rt.paused.Store(false)
	rt.mu.Unlock()
	for _, h := range q {
		finish(h.req, err)
	}
}

// routedDevice is the device a front end gets for a volume through the
// plugin: its own reference (local) plus the volume's route.
type routedDevice struct {
	export.Device
	rt       *route
	released atomic.Bool // the hold was dropped (Release or FollowRoles)
}

func newRoutedDevice(rt *route, local export.Device) *routedDevice {
	rt.opens.Add(1)
	return &routedDevice{Device: local, rt: rt}
}

func (d *routedDevice) Submit(req *export.Request) { d.rt.submit(d.Device, req) }

func (d *routedDevice) Info() export.Info {
	i := d.Device.Info()
	if r := d.rt.cur.Load(); r != nil && !r.primary.Load() {
		// Secondaries export read-only; NBD clients then never send writes.
		i.ReadOnly = true
	}
	return i
}

// FollowRoles (export.RoleFollower): see device.FollowRoles.
func (d *routedDevice) FollowRoles() {
	if d.released.CompareAndSwap(false, true) {
		d.rt.opens.Add(-1)
	}
}

// Release drops this client's hold (once) and the underlying reference.
func (d *routedDevice) Release() {
	if d.released.CompareAndSwap(false, true) {
		d.rt.opens.Add(-1)
	}
	d.Device.Release()
}

// flushDevice waits for a flush through dev: the engine orders it after
// every write submitted before it, so those are complete once it is.
func flushDevice(dev export.Device) error {
	done := make(chan error, 1)
	dev.Submit(&export.Request{Op: export.OpFlush, Done: func(q *export.Request) { done <- q.Err }})
	return <-done
}

var errVolumeDeleted = fmt.Errorf("repl: volume deleted: %w", syscall.EIO)
