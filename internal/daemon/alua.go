package daemon

import (
	"fmt"
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

// setVolumeRole records a replicated volume's role and tells the front
// ends (role.Mirror): the role controller's subscriber (New).
func (d *Daemon) setVolumeRole(name string, r VolumeRole) { d.roles.Set(name, r) }

// tellFrontEnds passes a role change to the front ends that follow roles.
func (d *Daemon) tellFrontEnds(name string, r VolumeRole) {
	for _, fe := range d.frontEnds {
		if o, ok := fe.(frontend.RoleObserver); ok {
			o.VolumeRoleChanged(name, r)
		}
	}
}

// volumeRole returns a volume's role (RoleStandalone unless set).
func (d *Daemon) volumeRole(name string) VolumeRole { return d.roles.Get(name) }
