package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
)

func init() {
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
				return daemon.PrintJSON(os.Stdout, st)
			}
			daemon.PrintStatus(os.Stdout, st)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory of the daemon")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rootCmd.AddCommand(cmd)
}
