package control

import (
	"errors"
	"fmt"
	"syscall"
)

// VolumeHooks are the checks other subsystems (replication) apply to
// volume deletion and resizing, with or without a running daemon. They are
// passed explicitly (Options.Hooks, OpenVolumeOps), never registered
// globally.
type VolumeHooks struct {
	Delete []DeleteCheck
	Resize []ResizeCheck
}

// MergeHooks joins hook sets.
func MergeHooks(hs []VolumeHooks) VolumeHooks {
	var out VolumeHooks
	for _, h := range hs {
		out.Delete = append(out.Delete, h.Delete...)
		out.Resize = append(out.Resize, h.Resize...)
	}
	return out
}

// DeleteCheck may refuse deleting a volume with a clear error (it sees
// force), with or without a running daemon: replication refuses a
// replicated volume without force, because its state (in the volume's
// state directory) goes with it.
type DeleteCheck func(dataDir, name string, force bool) error

// CheckDelete runs the delete checks.
func CheckDelete(checks []DeleteCheck, dataDir, name string, force bool) error {
	for _, c := range checks {
		if err := c(dataDir, name, force); err != nil {
			return err
		}
	}
	return nil
}

// ResizeCheck may refuse resizing a volume (to size bytes) with a clear
// error, with or without a running daemon: replication refuses for a
// replicated volume, whose two copies must stay the same size.
type ResizeCheck func(dataDir, name string, size int64) error

// CheckResize runs the resize checks.
func CheckResize(resizeChecks []ResizeCheck, dataDir, name string, size int64) error {
	for _, c := range resizeChecks {
		if err := c(dataDir, name, size); err != nil {
			return err
		}
	}
	return nil
}

// ReplicatedErr reports (through the replication resize check, which
// refuses exactly the replicated volumes) why vol's contents must not be
// replaced behind replication's back.
func ReplicatedErr(checks []ResizeCheck, dataDir, vol string) error {
	if err := CheckResize(checks, dataDir, vol, 0); err != nil && errors.Is(err, ErrReplicated) {
		return fmt.Errorf("volume %s: rollback %w: it would rewrite this copy behind replication's back, and the peer would keep "+
			"(and resync back) the data being rolled away; take the volume out of replication on both nodes first, "+
			"roll back, then set replication up again so the peer resyncs in full from this node", vol, ErrReplicated)
	}
	return nil
}

// AllocatedBytes is st_blocks*512 of the raw file: what thin provisioning
// actually uses on the host.
func AllocatedBytes(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
