// Command vmsan is the vmsan daemon and CLI. This package only wires
// subcommands together; each subcommand lives in its own file and registers
// itself on rootCmd from an init function, and calls into internal/ packages
// for everything that is not flag parsing.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:           "vmsan",
	Short:         "vmsan: a software SAN for KVM/QEMU virtual-machine disks",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "vmsan:", err)
		os.Exit(1)
	}
}
