// Package events is the daemon's in-process event bus: volumes created,
// changed and destroyed, front-end clients connecting and leaving,
// replication state changes and resync progress. `vmsan events` streams it
// over the control socket (GET /v1/events), in the manner of `drbdsetup
// events2`: first the current state of every object as "exists" lines,
// then one line per change until interrupted.
//
// Simplest use:
//
//	bus := events.NewBus()
//	sub := bus.Subscribe(256)
//	defer sub.Close()
//	bus.Publish(events.New(events.Create, "volume", "name", "vm1"))
//	for e := range sub.C() { fmt.Println(e) }
//	if sub.Overflowed() { ... } // the subscriber fell behind and was dropped
//
// Publish never blocks and never allocates per subscriber: each subscriber
// has a bounded buffer, and one that is full when an event arrives is
// dropped (its channel closed, Overflowed true) rather than slowing the
// publisher, which may be a front end accepting a connection or a
// replication loop. Memory is therefore bounded by subscribers × buffer.
//
// Concurrency: Bus and Sub methods are safe for concurrent use; a nil *Bus
// ignores Publish, so publishers built without one (tests) need not check.
package events

import (
	"encoding/json"
	"strings"
	"sync"
	"time"
)

// Kinds of event, as in `drbdsetup events2`.
const (
	Exists  = "exists"  // current state, sent once to a new subscriber
	Create  = "create"  // an object appeared
	Change  = "change"  // an object's attributes changed
	Destroy = "destroy" // an object went away
	// Overflow is the last line a subscriber gets when it fell behind and
	// was dropped (it has no object).
	Overflow = "overflow"
)

// Objects the daemon publishes.
const (
	Volume      = "volume"      // name, size, cache, read_only
	Client      = "client"      // id, front_end, volume, remote, since (destroy: duration)
	Replication = "replication" // volume, role, disk, connection, peer_role, peer_disk
	Resync      = "resync"      // volume, direction, left_bytes, percent
	// NoSpace: writes to a thin volume failed with ENOSPC (its filesystem
	// is full); at most one change line per volume every 10 s.
	NoSpace = "no-space" // volume, errors, last, fs_free_bytes
	// Copy: progress of a full copy (snapshot, clone, rollback --copy),
	// every 0.5 s and at the end.
	Copy = "copy" // volume, target, done_bytes, total_bytes, percent
	// Role: a replicated volume's role as front ends present it (role
	// controller): volume, role, was, cause; op and by for a change.
	Role = "role"
)

// Attr is one key:value of an event, kept in the publisher's order.
type Attr struct{ Key, Value string }

// Event is one line of the stream.
type Event struct {
	Time   time.Time
	Kind   string // Exists, Create, Change, Destroy
	Object string // Volume, Client, Replication, Resync
	Attrs  []Attr
}

// New builds an event stamped now from key, value pairs (an odd trailing
// key gets an empty value).
func New(kind, object string, kv ...string) Event {
	e := Event{Time: time.Now(), Kind: kind, Object: object, Attrs: make([]Attr, 0, (len(kv)+1)/2)}
	for i := 0; i < len(kv); i += 2 {
		a := Attr{Key: kv[i]}
		if i+1 < len(kv) {
			a.Value = kv[i+1]
		}
		e.Attrs = append(e.Attrs, a)
	}
	return e
}

// Get returns the value of key ("" when absent).
func (e Event) Get(key string) string {
	for _, a := range e.Attrs {
		if a.Key == key {
			return a.Value
		}
	}
	return ""
}

// String is the text form: "change replication volume:vm1 connection:Connected".
// Values with spaces or colons are quoted so a line splits on spaces.
func (e Event) String() string {
	if e.Object == "" {
		return e.Kind // "overflow"
	}
	var b strings.Builder
	b.WriteString(e.Kind)
	b.WriteByte(' ')
	b.WriteString(e.Object)
	for _, a := range e.Attrs {
		b.WriteByte(' ')
		b.WriteString(a.Key)
		b.WriteByte(':')
		if a.Value == "" || strings.ContainsAny(a.Value, " \t\n\"") {
			v, _ := json.Marshal(a.Value)
			b.Write(v)
		} else {
			b.WriteString(a.Value)
		}
	}
	return b.String()
}

// MarshalJSON is the --json form: {"time":..., "kind":..., "object":...,
// then the attributes as string fields}. An attribute named like one of
// the three fixed keys is dropped rather than overwrite it.
func (e Event) MarshalJSON() ([]byte, error) {
	m := make(map[string]string, len(e.Attrs)+3)
	for _, a := range e.Attrs {
		m[a.Key] = a.Value
	}
	m["time"] = e.Time.UTC().Format(time.RFC3339Nano)
	m["kind"] = e.Kind
	if e.Object != "" {
		m["object"] = e.Object
	}
	return json.Marshal(m)
}

// Bus fans events out to subscribers.
type Bus struct {
	mu   sync.Mutex
	subs map[*Sub]struct{}
}

// NewBus returns a bus with no subscribers.
func NewBus() *Bus { return &Bus{subs: map[*Sub]struct{}{}} }

// Sub is one subscriber: read C until it is closed.
type Sub struct {
	bus      *Bus
	ch       chan Event
	overflow bool // set under bus.mu before ch is closed
	closed   bool // under bus.mu
}

// Subscribe adds a subscriber with room for buf events (at least 1).
func (b *Bus) Subscribe(buf int) *Sub {
	s := &Sub{bus: b, ch: make(chan Event, max(buf, 1))}
	b.mu.Lock()
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	return s
}

// Publish hands e to every subscriber without blocking. A subscriber whose
// buffer is full is dropped: its channel is closed after the events it
// already holds, and Overflowed reports true.
// INVARIANT: Publish holds b.mu only for non-blocking sends.
func (b *Bus) Publish(e Event) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.ch <- e:
		default:
			s.overflow = true
			s.closed = true
			close(s.ch)
			delete(b.subs, s)
		}
	}
}

// Subscribers counts the current subscribers.
func (b *Bus) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// C is the subscriber's events; it is closed by Close or on overflow.
func (s *Sub) C() <-chan Event { return s.ch }

// Overflowed says the subscriber was dropped for falling behind. Valid
// once C is closed.
func (s *Sub) Overflowed() bool {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	return s.overflow
}

// Close unsubscribes; idempotent.
func (s *Sub) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.ch)
		delete(s.bus.subs, s)
	}
}
