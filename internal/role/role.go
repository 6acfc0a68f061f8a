// Package role owns the role of every replicated volume on this node:
// primary, secondary, or transitioning between the two. It is the one
// place a role changes.
//
// A Controller has one owner goroutine per registered volume. Every
// promote and demote (Change, called by the control API that `vmsan repl
// promote|demote` uses, and later by a cluster lease watcher) runs on that
// goroutine, and so does every publication of a role to the subscribers
// (the front ends: iSCSI turns roles into ALUA port group states). A change
// is, in order:
//
//  1. Options.Admit (the fencing plug-in point, see below) may refuse it;
//  2. subscribers are told Transitioning (iSCSI: ALUA transitioning, so
//     initiators retry instead of failing I/O);
//  3. Options.Drain waits, bounded by Options.DrainTimeout, for commands
//     front ends admitted under the old role. A timeout refuses a plain
//     change (the old role is published again, "role unchanged"); a forced
//     one goes ahead with a warning (the operator accepted that clients may
//     see errors);
//  4. the volume's Actuator (the replica) promotes or demotes;
//  5. subscribers are told the role the actuator reports now, whether the
//     change succeeded or not.
//
// Only one change per volume runs at a time. A Change for a volume whose
// change is still running is refused at once with an *InProgressError
// (errors.Is ErrInProgress) naming the running change and who asked for
// it; it is not queued. A queued promote behind a demote (or the reverse)
// would run against a role its caller never saw, and a caller that still
// wants it can retry knowing the outcome of the first.
//
// Roles the actuator changes on its own (a replica reports every role
// change it makes) reach the controller through Observe, which never
// blocks; the owner goroutine re-reads the actuator's role and publishes
// it if it differs. Subscribers therefore see, per volume, one ordered
// sequence of roles: Transitioning before the role a change ends in, and
// never a role older than the one they were last told.
//
// # Fencing (cluster mode)
//
// A caller holding a lease adds its fencing epoch to Request (a field
// added with the lease watcher) and the daemon passes an Admit function
// that compares it with the newest epoch seen for the volume, refusing
// older ones. Admit runs on the owner goroutine before anything else, so
// a stale epoch can never interleave with a newer change.
package role

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/events"
)

// Role is a volume's role as front ends present it.
type Role uint8

const (
	// Standalone: not replicated (the default); served read-write on
	// every path.
	Standalone Role = iota
	// Primary: this node serves the volume; the peer's paths are standby.
	Primary
	// Secondary: the peer serves it; this node's paths are standby.
	Secondary
	// Transitioning: a promote or demote is in progress (ALUA
	// transitioning: commands get NOT READY, 04/0A, and are retried).
	Transitioning
)

func (r Role) String() string {
	switch r {
	case Primary:
		return "primary"
	case Secondary:
		return "secondary"
	case Transitioning:
		return "changing"
	}
	return "standalone"
}

// Op is the change a Request asks for.
type Op uint8

const (
	Promote Op = iota + 1
	Demote
)

func (o Op) String() string {
	switch o {
	case Promote:
		return "promote"
	case Demote:
		return "demote"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Request is one role change.
type Request struct {
	Volume string
	Op     Op
	// Force: promote although the local disk is not UpToDate, demote
	// although clients hold the volume open (Actuator), and go ahead when
	// the drain times out.
	Force bool
	// By names who asked, for the log lines and events ("cli pid 4242",
	// "api"). Empty reads as "unknown".
	By string
}

func (q Request) by() string {
	if q.By == "" {
		return "unknown"
	}
	return q.By
}

// Actuator carries out a volume's role changes: the replica. Its methods
// are called from the volume's owner goroutine only (Promote and Demote
// never concurrently with each other); Role may also be called from the
// goroutine that called Register.
type Actuator interface {
	// Role is the volume's role now (Primary or Secondary; Standalone
	// when unknown). After Promote or Demote returns it reflects their
	// effect.
	Role() Role
	Promote(force bool) error
	Demote(force bool) error
}

// Cause says why a role was published.
type Cause string

const (
	CauseStart    Cause = "start"    // Register
	CauseChange   Cause = "change"   // a Change
	CauseObserved Cause = "observed" // the actuator changed it (Observe)
	CauseRemoved  Cause = "removed"  // Unregister: back to Standalone
	CauseCurrent  Cause = "current"  // a new subscriber's current role
)

// Event is one role published to the subscribers.
type Event struct {
	Volume string
	Role   Role
	Was    Role // the role published before (Standalone at first)
	Cause  Cause
	// Req is the change that led to it (CauseChange only).
	Req Request
}

// Subscriber gets every role of every volume. It is called on the
// volume's owner goroutine, so calls for one volume are ordered and never
// concurrent; calls for different volumes may be. REQUIRES: it returns
// promptly and does not call Change, Register or Unregister (the owner
// would wait for itself).
type Subscriber func(Event)

// Options configure a Controller.
type Options struct {
	// Drain waits (bounded by timeout) until every command front ends
	// admitted for the volume before Transitioning was published has
	// completed (daemon: the daemon's drainVolume). nil: nothing to drain.
	Drain func(volume string, timeout time.Duration) error
	// DrainTimeout bounds Drain (default 10 s).
	DrainTimeout time.Duration
	// Admit, if set, is asked first for every change, on the owner
	// goroutine; an error refuses the change (nothing published). The
	// cluster lease watcher's fencing check plugs in here.
	Admit func(Request) error
	// Log gets one line per change started, refused, failed and done,
	// with who asked (default: slog.Default()).
	Log *slog.Logger
	// Events gets a "role" change event per role published (nil: none).
	Events *events.Bus
}

// DefaultDrainTimeout is Options.DrainTimeout's default.
const DefaultDrainTimeout = 10 * time.Second

// ErrInProgress: another change of the same volume is running.
var ErrInProgress = errors.New("role change in progress")

// ErrNotManaged: the volume has no role owner on this node (it is not
// replicated here, or no longer).
var ErrNotManaged = errors.New("volume's role is not managed on this node")

// InProgressError refuses a Change while Running runs.
type InProgressError struct {
	Volume  string
	Running Request
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("volume %s: %v (%s asked by %s); try again once it is done", e.Volume, ErrInProgress, e.Running.Op, e.Running.by())
}

func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// Controller owns the roles of the registered volumes. Safe for
// concurrent use.
type Controller struct {
	o   Options
	log *slog.Logger

	mu     sync.Mutex
	owners map[string]*owner
	closed bool

	subs atomic.Pointer[[]Subscriber] // copy on write
}

// New returns a Controller with no volumes.
func New(o Options) *Controller {
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{o: o, log: log, owners: map[string]*owner{}}
	c.subs.Store(&[]Subscriber{})
	return c
}

// Subscribe adds fn to the subscribers. Volumes already registered are
// told to fn alone (CauseCurrent) on their owner goroutines, so fn never
// sees a role older than one it was told; it may be told the same role
// twice.
func (c *Controller) Subscribe(fn Subscriber) {
	c.mu.Lock()
	old := *c.subs.Load()
	n := append(append(make([]Subscriber, 0, len(old)+1), old...), fn)
	c.subs.Store(&n)
	owners := c.ownersLocked()
	c.mu.Unlock()
	for _, o := range owners {
		o.hello(fn)
	}
}

func (c *Controller) ownersLocked() []*owner {
	out := make([]*owner, 0, len(c.owners))
	for _, o := range c.owners {
		out = append(out, o)
	}
	return out
}

// Register makes the controller the owner of volume's role, carried out
// by act. When it returns, the subscribers have been told act's role
// (CauseStart).
func (c *Controller) Register(volume string, act Actuator) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("volume %s: role controller closed", volume)
	}
	if _, ok := c.owners[volume]; ok {
		c.mu.Unlock()
		return fmt.Errorf("volume %s: role already has an owner", volume)
	}
	o := &owner{c: c, name: volume, act: act, done: make(chan struct{}), dirty: true}
	o.cond = sync.NewCond(&o.mu)
	c.owners[volume] = o
	c.mu.Unlock()
	started := o.hello(nil) // queued behind the first read of act's role
	go o.run()
	<-started
	return nil
}

// Unregister ends the controller's ownership of volume's role (a volume
// no longer replicated, or deleted): it waits for the change running or
// queued to finish, refuses later ones (ErrNotManaged), and tells the
// subscribers Standalone.
func (c *Controller) Unregister(volume string) {
	c.mu.Lock()
	o := c.owners[volume]
	delete(c.owners, volume)
	c.mu.Unlock()
	if o != nil {
		o.stop(true)
	}
}

// Close stops every owner goroutine without publishing anything (the
// daemon is stopping; front ends go with it). Register fails afterwards.
func (c *Controller) Close() {
	c.mu.Lock()
	c.closed = true
	owners := c.ownersLocked()
	clear(c.owners)
	c.mu.Unlock()
	for _, o := range owners {
		o.stop(false)
	}
}

// Role returns the role last published for volume (false: not
// registered).
func (c *Controller) Role(volume string) (Role, bool) {
	o := c.owner(volume)
	if o == nil {
		return Standalone, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cur, true
}

// Roles returns every registered volume's published role, by name.
func (c *Controller) Roles() map[string]Role {
	c.mu.Lock()
	owners := c.ownersLocked()
	c.mu.Unlock()
	out := make(map[string]Role, len(owners))
	for _, o := range owners {
		o.mu.Lock()
		out[o.name] = o.cur
		o.mu.Unlock()
	}
	return out
}

// ExistsEvents is an "exists" role event per registered volume, for a new
// events subscriber's snapshot (daemon.AddEventSource).
func (c *Controller) ExistsEvents() []events.Event {
	roles := c.Roles()
	names := make([]string, 0, len(roles))
	for n := range roles {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]events.Event, 0, len(names))
	for _, n := range names {
		out = append(out, events.New(events.Exists, events.Role, "volume", n, "role", roles[n].String()))
	}
	return out
}

// Observe tells the controller that volume's actuator may have changed
// its role on its own. It never blocks (the replica calls it from its
// loop, which a running change may be waiting for); the owner re-reads
// the role and publishes it if it differs from the last published.
func (c *Controller) Observe(volume string) {
	if o := c.owner(volume); o != nil {
		o.mu.Lock()
		o.dirty = true
		o.cond.Signal()
		o.mu.Unlock()
	}
}

func (c *Controller) owner(volume string) *owner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owners[volume]
}

// Change runs one promote or demote of req.Volume on its owner goroutine
// and returns the role it ended in. It returns an *InProgressError at once
// while another change of the volume runs, and an error wrapping
// ErrNotManaged for a volume not registered. A done ctx makes Change
// return ctx.Err() early; the change itself still runs to its end (a role
// change abandoned half-way would leave the front ends transitioning).
func (c *Controller) Change(ctx context.Context, req Request) (Role, error) {
	if req.Op != Promote && req.Op != Demote {
		return Standalone, fmt.Errorf("volume %s: unknown role change %v", req.Volume, req.Op)
	}
	o := c.owner(req.Volume)
	if o == nil {
		return Standalone, fmt.Errorf("volume %s: %w", req.Volume, ErrNotManaged)
	}
	j := &job{req: req, done: make(chan struct{})}
	o.mu.Lock()
	if o.stopping {
		o.mu.Unlock()
		return Standalone, fmt.Errorf("volume %s: %w", req.Volume, ErrNotManaged)
	}
	if o.change != nil {
		running := o.change.req
		o.mu.Unlock()
		c.log.Warn("role change refused: another is in progress", "volume", req.Volume, "op", req.Op.String(), "force", req.Force,
			"by", req.by(), "running", running.Op.String(), "running_by", running.by())
		return Standalone, &InProgressError{Volume: req.Volume, Running: running}
	}
	o.change = j
	o.cond.Signal()
	o.mu.Unlock()
	select {
	case <-j.done:
		return j.role, j.err
	case <-ctx.Done():
		return Standalone, ctx.Err()
	}
}

// job is one Change waiting for or run by its owner.
type job struct {
	req  Request
	done chan struct{}
	role Role
	err  error
}

type hello struct {
	fn   Subscriber // nil: only signal done (Register)
	done chan struct{}
}

// owner is one volume's role owner. Its goroutine (run) is the only one
// that calls the actuator's Promote/Demote and the subscribers.
type owner struct {
	c    *Controller
	name string
	act  Actuator
	done chan struct{} // closed when run returns

	mu   sync.Mutex
	cond *sync.Cond
	// cur is the role last published. INVARIANT: written only by run.
	cur Role
	// change is the Change waiting or running; non-nil refuses others.
	change  *job
	started bool // change is running (not just queued)
	dirty   bool // re-read the actuator's role (Observe, Register)
	hellos  []hello
	// stopping: run finishes what runs and returns; removed: it then
	// publishes Standalone.
	stopping, removed bool
}

func (o *owner) hello(fn Subscriber) <-chan struct{} {
	h := hello{fn: fn, done: make(chan struct{})}
	o.mu.Lock()
	if o.stopping {
		o.mu.Unlock()
		close(h.done)
		return h.done
	}
	o.hellos = append(o.hellos, h)
	o.cond.Signal()
	o.mu.Unlock()
	return h.done
}

func (o *owner) stop(removed bool) {
	o.mu.Lock()
	o.stopping, o.removed = true, removed
	o.cond.Signal()
	o.mu.Unlock()
	<-o.done
}

// run is the owner goroutine. Order of work: the actuator's role when
// dirty (so a change starts from, and a new subscriber is told, the
// newest), then new subscribers' current roles (before any change they
// could otherwise see half of), then a change.
func (o *owner) run() {
	defer close(o.done)
	for {
		o.mu.Lock()
		for !o.dirty && (o.change == nil || o.started) && len(o.hellos) == 0 && !o.stopping {
			o.cond.Wait()
		}
		switch {
		case o.dirty:
			o.dirty = false
			o.mu.Unlock()
			cause := CauseObserved
			if o.cur == Standalone {
				cause = CauseStart
			}
			o.publish(o.act.Role(), cause, Request{})
		case len(o.hellos) > 0:
			h := o.hellos[0]
			o.hellos = o.hellos[1:]
			cur := o.cur
			o.mu.Unlock()
			if h.fn != nil {
				h.fn(Event{Volume: o.name, Role: cur, Was: cur, Cause: CauseCurrent})
			}
			close(h.done)
		case o.change != nil && !o.started:
			o.started = true
			j := o.change
			o.mu.Unlock()
			j.role, j.err = o.do(j.req)
			o.mu.Lock()
			o.change, o.started = nil, false
			o.mu.Unlock()
			close(j.done)
		default: // stopping, nothing else to do
			hellos := o.hellos
			o.hellos = nil
			removed := o.removed
			o.mu.Unlock()
			for _, h := range hellos {
				close(h.done)
			}
			if removed {
				o.publish(Standalone, CauseRemoved, Request{})
			}
			return
		}
	}
}

// do runs one change (the steps in the package comment). REQUIRES: the
// owner goroutine.
func (o *owner) do(req Request) (Role, error) {
	c := o.c
	log := c.log.With("volume", o.name, "op", req.Op.String(), "force", req.Force, "by", req.by())
	if c.o.Admit != nil {
		if err := c.o.Admit(req); err != nil {
			log.Warn("role change refused", "role", o.cur.String(), "err", err)
			return o.cur, fmt.Errorf("volume %s: %s refused: %w", o.name, req.Op, err)
		}
	}
	was := o.act.Role()
	log.Info("role change started", "role", was.String())
	o.publish(Transitioning, CauseChange, req)
	if c.o.Drain != nil {
		// Commands that passed the front ends' role check before
		// Transitioning may still be running: let them finish as the old
		// role, else a write admitted on a primary meets the demoted
		// (read-only) device and the initiator sees DATA PROTECT, not a
		// path change.
		if err := c.o.Drain(o.name, c.o.DrainTimeout); err != nil {
			if !req.Force {
				now := o.act.Role()
				o.publish(now, CauseChange, req)
				log.Warn("role change refused: commands admitted under the old role still running", "role", now.String(), "err", err)
				return now, fmt.Errorf("%s refused, role unchanged: %w", req.Op, err)
			}
			log.Warn("forced role change with commands still running", "err", err)
		}
	}
	var err error
	if req.Op == Promote {
		err = o.act.Promote(req.Force)
	} else {
		err = o.act.Demote(req.Force)
	}
	now := o.act.Role()
	o.publish(now, CauseChange, req)
	if err != nil {
		log.Warn("role change failed", "role", now.String(), "was", was.String(), "err", err)
		return now, err
	}
	log.Info("role change done", "role", now.String(), "was", was.String())
	return now, nil
}

// publish tells the subscribers r (nothing when it is the role last
// published). REQUIRES: the owner goroutine.
func (o *owner) publish(r Role, cause Cause, req Request) {
	was := o.cur
	if r == was {
		return
	}
	o.mu.Lock()
	o.cur = r
	o.mu.Unlock()
	ev := Event{Volume: o.name, Role: r, Was: was, Cause: cause, Req: req}
	for _, fn := range *o.c.subs.Load() {
		fn(ev)
	}
	kv := []string{"volume", o.name, "role", r.String(), "was", was.String(), "cause", string(cause)}
	if cause == CauseChange {
		kv = append(kv, "op", req.Op.String(), "by", req.by())
	}
	o.c.o.Events.Publish(events.New(events.Change, events.Role, kv...))
}
