package main

import (
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/doctor"
)

// errDoctorFailed makes `vmsan doctor` exit 1 after printing its report.
type errDoctorFailed struct{ summary string }

func (e errDoctorFailed) Error() string { return "doctor: checks failed (" + e.summary + ")" }

func newDoctorCmd() *cobra.Command {
	var dataDir, peer, cfgPath string
	var asJSON, noHistory bool
	cmd := &cobra.Command{
		Use:   "doctor [--data-dir DIR] [--peer HOST:PORT] [--config FILE] [--json]",
		Short: "Check this host's disk, filesystem, network and client settings for serving VM disks",
		Long: `Check the host for what decides how well and how safely it serves VM disks:
the block device under the data directory (rotational, scheduler, read-ahead,
queue depth, request size, write cache) against the volumes' settings, the
filesystem (type, barriers, O_DIRECT), fragmentation of the volume files,
thin-provisioning overcommit and the free-space trend, MTU and TCP buffers
of the interfaces used by listeners and the replication peer, the
replication link's round trip against its timeouts (--peer), each volume's
cache mode, and on client hosts /etc/multipath.conf and open-iscsi.

Each row has a status (ok, warn, fail), the evidence and a concrete fix.
Exit status: 0 when no check fails (warnings included), 1 when any check
fails or the command itself cannot run. See docs/doctor.md.

The free-space trend keeps samples in DATA_DIR/doctor-history.json (one per
run, at most one a minute); --no-history neither reads nor writes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := doctor.Options{DataDir: dataDir, Peer: peer, History: !noHistory, DataDirGiven: cmd.Flags().Changed("data-dir")}
			if cfgPath != "" {
				cfg, err := config.Load(cfgPath)
				if err != nil {
					return err
				}
				if !cmd.Flags().Changed("data-dir") && cfg.DataDir != "" {
					o.DataDir, o.DataDirGiven = cfg.DataDir, true
				}
				o.Listen = cfg.Listen
				for _, v := range cfg.Volumes {
					if v.Replication == nil {
						continue
					}
					r := v.Replication.Settings().WithDefaults()
					o.Repl = append(o.Repl, doctor.Repl{
						Volume: v.Name, Listen: r.Listen, Peer: r.Peer, Protocol: r.Protocol,
						PingTimeout: time.Duration(r.PingTimeout), KoTimeout: time.Duration(r.KoTimeout),
						ResyncRate: int64(r.ResyncRate),
					})
				}
			} else {
				o.Listen = []string{config.DefaultListen}
			}
			rs := doctor.Run(doctor.RealHost(), o)
			out := cmd.OutOrStdout()
			var err error
			if asJSON {
				err = doctor.WriteJSON(out, rs)
			} else {
				err = doctor.WriteTable(out, rs, termWidth(out))
			}
			if err != nil {
				return err
			}
			if doctor.Failed(rs) {
				return errDoctorFailed{doctor.Summary(rs)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory to examine (volumes, replication settings)")
	f.StringVar(&peer, "peer", "", "replication peer HOST:PORT to measure (TCP connects to its replication port)")
	f.StringVar(&cfgPath, "config", "", "vmsan serve configuration file (listen addresses, data_dir, per-volume replication)")
	f.BoolVar(&asJSON, "json", false, "print a JSON array of {check, subject, status, evidence, fix}")
	f.BoolVar(&noHistory, "no-history", false, "do not record or read free-space samples in the data directory")
	return cmd
}

// termWidth is the terminal's width when out is one, else $COLUMNS, else
// 0 (the table's default width).
func termWidth(out any) int {
	if f, ok := out.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			return int(ws.Col)
		}
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 0
}
