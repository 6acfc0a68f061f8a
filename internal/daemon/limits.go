package daemon

import (
	"github.com/vmsan/vmsan/internal/netutil"
)

// File descriptors: the Go runtime raises the RLIMIT_NOFILE soft limit
// to the hard limit at start, so the daemon can use all it is allowed.
// The data path (NBD connections, iSCSI sessions, replication links,
// volume files) must keep the most of them: listeners that are not the
// data path get a bounded share, derived from the limit (fdShare), so a
// flood on them runs into their own cap, never into EMFILE for a client:
//
//   - metrics: at most metrics.MaxConns connections, and at most 1/16 of
//     the limit; past it new connections wait in the kernel's backlog
//     (no descriptor used) until one closes; idle keep-alive connections
//     close after the metrics listener's idle timeout;
//   - iSCSI connections still logging in: iscsi.max_pending_logins
//     (default 64), at most 1/8 of the limit; past it closed at accept;
//   - NBD connections still in the handshake: max_pending_handshakes
//     (default 64), at most 1/8 of the limit; past it closed at accept,
//     and each closed after handshake_timeout (default 30 s).
//
// Every listener retries accept errors (netutil.Retry) instead of
// stopping, so running out of descriptors anyway (a flood of data-path
// connections) pauses accepting, logged, until descriptors are free.

// fdShare is a non-data listener's connection cap: configured (def when
// 0), bounded by 1/div of the file descriptor limit (at least 4).
func fdShare(configured, def, div int) int {
	v := configured
	if v <= 0 {
		v = def
	}
	return netutil.Share(v, netutil.NofileLimit(), div, 4)
}
