package role

import (
	"log/slog"
	"sync"
)

// Mirror is the volumes' roles as the front ends were told them: the
// daemon's subscriber to the Controller records each change and passes
// it on (tell) in the order it was published.
type Mirror struct {
	log  *slog.Logger
	tell func(name string, r Role)
	mu   sync.Mutex
	m    map[string]Role
	// apply serialises the observers' calls, so that two role changes in
	// quick succession reach every front end in the order they were set.
	apply sync.Mutex
}

// NewMirror passes each change on to tell (the daemon: to the front
// ends), logging it.
func NewMirror(log *slog.Logger, tell func(name string, r Role)) *Mirror {
	return &Mirror{log: log, tell: tell}
}

// Set records a replicated volume's role and tells the front ends (iSCSI
// changes the volume's ALUA states and raises the unit attention
// ASYMMETRIC ACCESS STATE CHANGED). The daemon calls it from the role
// controller's subscriber: on the volume's owner goroutine, in the order
// the roles were published. Safe for concurrent use.
func (d *Mirror) Set(name string, r Role) {
	d.apply.Lock()
	defer d.apply.Unlock()
	d.mu.Lock()
	if d.m == nil {
		d.m = map[string]Role{}
	}
	old := d.m[name]
	if r == Standalone {
		delete(d.m, name)
	} else {
		d.m[name] = r
	}
	d.mu.Unlock()
	if old == r {
		return
	}
	d.log.Info("volume role for front ends", "volume", name, "role", r.String(), "was", old.String())
	d.tell(name, r)
}

// Get returns a volume's role (Standalone unless set).
func (d *Mirror) Get(name string) Role {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[name]
}
