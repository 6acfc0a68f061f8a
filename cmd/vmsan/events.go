package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
)

func newEventsCmd() *cobra.Command {
	var (
		dataDir     string
		asJSON, now bool
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream volume, client and replication state changes (like drbdsetup events2)",
		Long: `Print the current state of every object as "exists" lines, ended by
"exists -", then one line per change (create, change, destroy) as it
happens, until interrupted. Objects: volume, client (a front-end
connection), replication (role, disk and connection states), resync
(progress), role (the role front ends present: primary, secondary, or
changing during a promote or demote, with who asked). With --now, stop after the current state. A reader that falls
too far behind is dropped with a final "overflow" line.

  exists volume name:vm1 size:21474836480 cache:writeback read_only:false
  exists -
  create client id:3 front_end:nbd volume:vm1 remote:127.0.0.1:50412 since:2025-01-01T10:00:00Z
  change replication volume:vm1 role:Primary disk:UpToDate connection:Connected peer_role:Secondary peer_disk:UpToDate
  destroy client id:3 front_end:nbd volume:vm1 remote:127.0.0.1:50412 duration:1m2.5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := daemon.Dial(dataDir)
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			body, err := c.Events(ctx, now, asJSON)
			if err != nil {
				return err
			}
			defer body.Close()
			sc := bufio.NewScanner(body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			w := bufio.NewWriter(os.Stdout)
			last := ""
			for sc.Scan() {
				last = sc.Text()
				w.WriteString(last)
				w.WriteByte('\n')
				if err := w.Flush(); err != nil { // one line at a time: consumers read as it happens
					return err
				}
			}
			switch {
			case ctx.Err() != nil, now:
				return nil
			case last == "overflow" || strings.Contains(last, `"kind":"overflow"`):
				return errors.New("event stream dropped: this reader fell behind (events were lost; restart it)")
			case sc.Err() != nil:
				return fmt.Errorf("event stream: %w", sc.Err())
			}
			return errors.New("event stream ended: the daemon stopped")
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory of the daemon")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.Flags().BoolVar(&now, "now", false, "print the current state and exit")
	return cmd
}
