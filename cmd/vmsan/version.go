package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/version"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the vmsan version, Go version and source revision",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			i := version.Get()
			if asJSON {
				b, err := json.MarshalIndent(i, "", "  ")
				if err != nil {
					return err
				}
				fmt.Println(string(b))
				return nil
			}
			fmt.Fprintf(os.Stdout, "vmsan %s\ngo: %s\n", i.Version, i.GoVersion)
			if i.Revision != "" {
				mod := ""
				if i.Modified {
					mod = " (modified)"
				}
				fmt.Fprintf(os.Stdout, "revision: %s%s\n", i.Revision, mod)
			}
			if i.Time != "" {
				fmt.Fprintf(os.Stdout, "revision time: %s\n", i.Time)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
