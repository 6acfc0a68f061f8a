package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
	"github.com/vmsan/vmsan/internal/volume"
)

// connUp reports whether a connection state (repl.ConnState's name) means
// the peer is connected and its role and disk are current.
func connUp(c string) bool {
	switch c {
	case "Connected", "SyncSource", "SyncTarget", "VerifySource", "VerifyTarget":
		return true
	}
	return false
}

func kib(b int64) string { return strconv.FormatInt((b+1023)/1024, 10) + "KiB" }

func eta(sec float64) string {
	if sec < 1 {
		return "<1s"
	}
	return (time.Duration(sec*float64(time.Second)) + time.Second/2).Truncate(time.Second).String()
}

// writeReplBlocks prints statuses the way `drbdadm status` lays out a
// resource: the volume and its role, the local disk, then the peer: its
// role and, indented, the replication state and the peer's disk, or only
// the connection state while not connected (nothing stale about the
// peer). Connected is shown as DRBD's replication state "Established".
// Progress, amounts and rates are appended as key:value words.
func writeReplBlocks(w io.Writer, sts []driver.Status) {
	for _, s := range sts {
		fmt.Fprintf(w, "%s role:%s\n", s.Volume, s.Role)
		fmt.Fprintf(w, "  disk:%s\n", s.Disk)
		var more []string
		if !connUp(s.Conn) {
			fmt.Fprintf(w, "  peer connection:%s\n", s.Conn)
			if s.OutOfSync > 0 {
				more = append(more, "out-of-sync:"+kib(s.OutOfSync))
			}
			if s.PendingWrites > 0 {
				more = append(more, "pending:"+strconv.Itoa(s.PendingWrites))
			}
			if s.LastError != "" {
				more = append(more, "last-error:"+strconv.Quote(s.LastError))
			}
			if s.DiscardMyData {
				more = append(more, "discard-my-data:yes")
			}
			if len(more) > 0 {
				fmt.Fprintf(w, "    %s\n", strings.Join(more, " "))
			}
			continue
		}
		rs := s.Conn
		if rs == "Connected" {
			rs = "Established"
		}
		fmt.Fprintf(w, "  peer role:%s\n", s.PeerRole)
		more = append(more, "replication:"+rs, "peer-disk:"+s.PeerDisk)
		if s.SyncTotal > 0 {
			more = append(more, fmt.Sprintf("done:%.2f", s.SyncPct))
		}
		if s.OutOfSync > 0 {
			more = append(more, "out-of-sync:"+kib(s.OutOfSync))
		}
		if s.SyncRate > 0 {
			more = append(more, "rate:"+kib(int64(s.SyncRate))+"/s")
		}
		if s.ETASeconds > 0 {
			more = append(more, "eta:"+eta(s.ETASeconds))
		}
		if s.PendingWrites > 0 {
			more = append(more, "pending:"+strconv.Itoa(s.PendingWrites))
		}
		fmt.Fprintf(w, "    %s\n", strings.Join(more, " "))
	}
}

// writeReplTable prints one line per replicated volume (the replication
// section of `vmsan status`, and the answer to repl operations).
func writeReplTable(w io.Writer, sts []driver.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tROLE\tDISK\tCONNECTION\tPEER ROLE\tPEER DISK\tOUT OF SYNC\tRESYNC")
	for _, s := range sts {
		prog := "-"
		if s.SyncTotal > 0 {
			prog = fmt.Sprintf("%.1f%%", s.SyncPct)
			if s.ETASeconds > 0 {
				prog += " eta " + eta(s.ETASeconds)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Volume, s.Role, s.Disk, s.Conn, s.PeerRole, s.PeerDisk,
			volume.HumanSize(s.OutOfSync), prog)
	}
	tw.Flush()
}

// filterRepl keeps the named volume's status; an unknown name is an error
// that lists what is replicated here.
func filterRepl(sts []driver.Status, name string) ([]driver.Status, error) {
	names := make([]string, 0, len(sts))
	for _, s := range sts {
		if s.Volume == name {
			return []driver.Status{s}, nil
		}
		names = append(names, s.Volume)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("volume %q is not replicated on this node (no replicated volumes)", name)
	}
	return nil, fmt.Errorf("volume %q is not replicated on this node (replicated: %s)", name, strings.Join(names, ", "))
}

// replStatusCommand is `vmsan repl status [VOLUME] [--json]`; dataDir is
// the repl command's persistent flag.
func replStatusCommand(dataDir *string) *cobra.Command {
	var asJSON bool
	status := &cobra.Command{
		Use:   "status [VOLUME]",
		Short: "Roles, disk and connection states, resync progress/ETA and out-of-sync amount (drbdadm status layout)",
		Long: `Print one block per replicated volume, laid out like drbdadm status:

  vm1 role:Primary
    disk:UpToDate
    peer role:Secondary
      replication:SyncSource peer-disk:Inconsistent done:43.20 out-of-sync:5120KiB rate:20480KiB/s eta:1s

While the peer is not connected only its connection state is shown
("peer connection:Connecting"), with the out-of-sync amount and the
last disconnect reason. --json prints the same as a list of objects
(fields documented in docs/replication.md).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := daemon.Dial(*dataDir)
			if err != nil {
				return err
			}
			defer c.Close()
			var st []driver.Status
			if err := c.Do("GET", "/v1/repl", nil, &st); err != nil {
				// Without replicated volumes the daemon has no /v1/repl.
				var ae *daemon.APIError
				if errors.As(err, &ae) && strings.Contains(ae.Message, "404") {
					return errors.New("no replicated volumes on this node")
				}
				return err
			}
			if len(args) == 1 {
				if st, err = filterRepl(st, args[0]); err != nil {
					return err
				}
			}
			if asJSON {
				return PrintJSON(os.Stdout, st)
			}
			writeReplBlocks(os.Stdout, st)
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON (a list, also for one volume)")
	return status
}
