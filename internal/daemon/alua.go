package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/role"
)

// VolumeRole is a volume's role in a replicated pair as front ends present
// it to initiators (iSCSI: ALUA asymmetric access states). The role
// controller (internal/role; host.Host.Roles for plugins) owns it: replication registers
// each replica there, promote and demote run there, and the daemon
// subscribes the front ends, so that neither imports the other.
type VolumeRole = role.Role

const (
	// RoleStandalone: not replicated (the default); served read-write on
	// every path.
	RoleStandalone = role.Standalone
	// RolePrimary: this node serves the volume; the peer's paths are
	// standby.
	RolePrimary = role.Primary
	// RoleSecondary: the peer serves it; this node's paths are standby.
	RoleSecondary = role.Secondary
	// RoleChanging: a promote or demote is in progress (ALUA
	// transitioning: commands get NOT READY, 04/0A, and are retried).
	RoleChanging = role.Transitioning
)

// drainVolume waits (bounded by timeout) until every command that front
// ends admitted for the volume before the role controller published
// RoleChanging has completed. The controller calls it between that and a
// promote or demote (role.Options.Drain), so no
// write admitted as primary meets the read-only secondary (EROFS, which
// an initiator would see as a target error instead of a path change).
func (d *Daemon) drainVolume(name string, timeout time.Duration) error {
	for _, fe := range d.frontEnds {
		if o, ok := fe.(frontend.RoleDrainer); ok {
			if err := o.DrainVolume(name, timeout); err != nil {
				return fmt.Errorf("volume %s: %w", name, err)
			}
		}
	}
	return nil
}

type volumeRoles struct {
	mu sync.Mutex
	m  map[string]VolumeRole
	// apply serialises the observers' calls, so that two role changes in
	// quick succession reach every front end in the order they were set.
	apply sync.Mutex
}

// setVolumeRole records a replicated volume's role and tells the front
// ends (iSCSI changes the volume's ALUA states and raises the unit
// attention ASYMMETRIC ACCESS STATE CHANGED). It is the role controller's
// subscriber (New): called on the volume's owner goroutine, in the order
// the roles were published. Safe for concurrent use.
func (d *Daemon) setVolumeRole(name string, r VolumeRole) {
	d.roles.apply.Lock()
	defer d.roles.apply.Unlock()
	d.roles.mu.Lock()
	if d.roles.m == nil {
		d.roles.m = map[string]VolumeRole{}
	}
	old := d.roles.m[name]
	if r == RoleStandalone {
		delete(d.roles.m, name)
	} else {
		d.roles.m[name] = r
	}
	d.roles.mu.Unlock()
	if old == r {
		return
	}
	d.log.Info("volume role for front ends", "volume", name, "role", r.String(), "was", old.String())
	for _, fe := range d.frontEnds {
		if o, ok := fe.(frontend.RoleObserver); ok {
			o.VolumeRoleChanged(name, r)
		}
	}
}

// volumeRole returns a volume's role (RoleStandalone unless set).
func (d *Daemon) volumeRole(name string) VolumeRole {
	d.roles.mu.Lock()
	defer d.roles.mu.Unlock()
	return d.roles.m[name]
}
