package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/doctor"
	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
)

// multipathOpts are the knobs of `vmsan iscsi multipath-conf`.
type multipathOpts struct {
	noPathRetry        int // checker intervals to queue with no path left
	replacementTimeout int // open-iscsi: seconds before failing I/O to dm-multipath
	noopInterval       int // open-iscsi: NOP-Out ping interval (s)
	noopTimeout        int // open-iscsi: NOP-Out answer timeout (s)
}

// defaultMultipathOpts are the recommended settings: a path lost without
// a word (a silent network) is noticed by the NOP-Out ping within
// noopInterval+noopTimeout seconds and its I/O goes to another path
// replacementTimeout (fast_io_fail_tmo) seconds later, 4 s in all, inside
// the 5 s path failover target; a closed connection takes only the
// recovery timeout, 2 s. Shorter timers fail paths on hiccups of a
// loaded network. no_path_retry 30 queues I/O with no usable path for 30
// checker intervals (150 s at multipathd's default 5 s): long enough for
// a node failover's promote. Measured: docs/iscsi.md "Measured".
var defaultMultipathOpts = multipathOpts{noPathRetry: 30,
	replacementTimeout: doctor.RecommendedReplacementTimeout,
	noopInterval:       doctor.RecommendedNoopInterval,
	noopTimeout:        doctor.RecommendedNoopTimeout}

// writeMultipathConf prints a multipath.conf devices section for vmsan's
// logical units and, as comments (so the whole output is still a valid
// multipath.conf), the open-iscsi settings that go with it. Why each
// value: docs/iscsi.md "Multipath".
func writeMultipathConf(w io.Writer, o multipathOpts) {
	var b strings.Builder
	fmt.Fprintf(&b, `# multipath.conf for vmsan iSCSI logical units (vmsan iscsi multipath-conf).
# Paths are grouped by ALUA state: the active/optimized group (a single
# node's portals, or the primary's in a replicated pair) carries the I/O,
# standby paths (the secondary's: NOT READY 04/0B) wait; a path's loss
# moves I/O to the next path of the group, an ALUA state change (2A/06,
# after vmsan repl promote) moves it to the newly active group.
# With no path left, I/O queues for no_path_retry checker intervals
# (polling_interval, 5 s by default) before failing: time to promote.
# multipathd writes fast_io_fail_tmo into each iSCSI session's recovery
# timeout (over open-iscsi's replacement_timeout): it is the failover time.
devices {
	device {
		vendor "%s"
		product "%s"
		path_grouping_policy group_by_prio
		prio alua
		hardware_handler "1 alua"
		path_checker tur
		path_selector "service-time 0"
		failback immediate
		no_path_retry %d
		fast_io_fail_tmo %d
		dev_loss_tmo 30
		rr_min_io_rq 1
		detect_prio yes
	}
}
# open-iscsi (/etc/iscsi/iscsid.conf before discovery, or per node:
#   iscsiadm -m node -T IQN -p PORTAL -o update -n KEY -v VALUE):
# fail a dead path's I/O to dm-multipath after %d s instead of 120 s, and
# notice a silent target within %d+%d s:
#   node.session.timeo.replacement_timeout = %d
#   node.conn[0].timeo.noop_out_interval = %d
#   node.conn[0].timeo.noop_out_timeout = %d
#   node.startup = automatic
# The target must close a silent path's connection before this host
# resends its I/O on another path, or commands the network still holds
# execute over newer data when the path returns: vmsan's iscsi
# nop_interval + nop_timeout (default 1 s + 1 s) must stay below
# noop_out_timeout + fast_io_fail_tmo - 0.5 s = %.1f s here.
`, iscsifront.Vendor, iscsifront.Product, o.noPathRetry, o.replacementTimeout, o.replacementTimeout, o.noopInterval, o.noopTimeout,
		o.replacementTimeout, o.noopInterval, o.noopTimeout, o.targetNopLimit().Seconds())
	io.WriteString(w, b.String())
}

// targetNopLimit is the most the target's nop_interval + nop_timeout may
// add up to with these host timers. The initiator resends a silent
// path's I/O noop_out_interval + noop_out_timeout + recovery timeout
// after it last heard the target; the target may have heard the
// initiator (its ping) up to noop_out_interval later than that, and then
// takes nop_interval + nop_timeout plus the pinger's tick to close: so
// the sum must stay below noop_out_timeout + recovery timeout, less a
// margin of 0.5 s for the tick and scheduling.
func (o multipathOpts) targetNopLimit() time.Duration {
	return time.Duration(o.noopTimeout+o.replacementTimeout)*time.Second - 500*time.Millisecond
}

// iscsiShowCmd is `vmsan iscsi show`: the running daemon's targets,
// portals, access settings and sessions (the daemon's GET /v1/iscsi).
func iscsiShowCmd() *cobra.Command {
	var dataDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show the running daemon's iSCSI targets, LUNs, portals, ACLs, CHAP users and sessions",
		Long: `Show the running daemon's iSCSI configuration in force and its sessions:
the node IQN and mode, portals and portal groups, each target with its
LUN -> volume map, ACL, CHAP user names (never secrets) and what access
they give (acl, chap, acl+chap, any, refused), and every logged-in session
with its initiator IQN, ISID, TSIH, portal, connection count, digests,
negotiated limits (MaxRecvDataSegmentLength both ways, MaxBurstLength,
FirstBurstLength, ImmediateData, InitialR2T) and commands in flight.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := daemon.Dial(dataDir)
			if err != nil {
				return err
			}
			defer c.Close()
			in, err := daemon.ISCSIShow(c)
			if err != nil {
				return err
			}
			if asJSON {
				return PrintJSON(cmd.OutOrStdout(), in)
			}
			daemon.PrintISCSI(cmd.OutOrStdout(), in)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory of the daemon")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newISCSICmd() *cobra.Command {
	ic := &cobra.Command{
		Use:   "iscsi",
		Short: "iSCSI helpers (the target itself runs in vmsan serve --iscsi-listen)",
	}
	o := defaultMultipathOpts
	mc := &cobra.Command{
		Use:   "multipath-conf",
		Short: "Print a multipath.conf device section and open-iscsi timeouts for vmsan LUNs",
		Long: `Print a multipath.conf devices section for vmsan's logical units (ALUA:
group_by_prio, prio alua, hardware_handler "1 alua", path_checker tur,
failback immediate, no_path_retry) and, as comments, the open-iscsi
settings that make a path failover take seconds. See docs/iscsi.md.

  vmsan iscsi multipath-conf >> /etc/multipath.conf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.noPathRetry < 1 || o.replacementTimeout < 1 || o.noopInterval < 1 || o.noopTimeout < 1 {
				return fmt.Errorf("every value must be at least 1")
			}
			writeMultipathConf(cmd.OutOrStdout(), o)
			return nil
		},
	}
	mc.Flags().IntVar(&o.noPathRetry, "no-path-retry", o.noPathRetry, "checker intervals to queue I/O when no path is left (covers a node failover's promote)")
	mc.Flags().IntVar(&o.replacementTimeout, "replacement-timeout", o.replacementTimeout, "seconds before a lost session's I/O fails over (multipath.conf fast_io_fail_tmo and open-iscsi replacement_timeout)")
	mc.Flags().IntVar(&o.noopInterval, "noop-interval", o.noopInterval, "open-iscsi: NOP-Out ping interval in seconds")
	mc.Flags().IntVar(&o.noopTimeout, "noop-timeout", o.noopTimeout, "open-iscsi: NOP-Out timeout in seconds")
	ic.AddCommand(mc)
	ic.AddCommand(iscsiShowCmd())
	return ic
}
