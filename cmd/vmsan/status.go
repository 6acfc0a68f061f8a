package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

func newStatusCmd() *cobra.Command {
	var dataDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the running daemon's volumes, exports, connections and engine statistics",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := daemon.Dial(dataDir)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Status()
			if err != nil {
				return err
			}
			if asJSON {
				return PrintJSON(os.Stdout, st)
			}
			printStatus(os.Stdout, st)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory of the daemon")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printStatus is daemon.PrintStatus with the replication section as a
// table (the daemon package prints unknown sections as JSON and does not
// know the replication types).
func printStatus(w io.Writer, st daemon.Status) {
	raw, ok := st.Extra["replication"]
	var rs []driver.Status
	if ok {
		// Extra arrives as decoded JSON (map[string]any): re-decode it
		// into the typed status. On failure the generic JSON stays.
		b, err := json.Marshal(raw)
		if err == nil && json.Unmarshal(b, &rs) == nil {
			extra := make(map[string]any, len(st.Extra))
			for k, v := range st.Extra {
				if k != "replication" {
					extra[k] = v
				}
			}
			st.Extra = extra
		} else {
			ok = false
		}
	}
	PrintStatus(w, st)
	if ok {
		fmt.Fprintln(w, "\nreplication:")
		writeReplTable(w, rs)
	}
}
