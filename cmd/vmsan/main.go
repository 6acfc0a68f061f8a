// Command vmsan is the vmsan daemon and CLI. This package only wires
// subcommands together: each command group lives in its own file with a
// builder returning its *cobra.Command (newVolumeCmd in volume.go, ...),
// newRootCmd assembles them, and everything that is not flag parsing is
// in internal/ packages. A fresh tree per newRootCmd call means a test
// runs a command with no flag values left over from another.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/version"
)

// newRootCmd builds the whole command tree, finished (finishTree).
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "vmsan",
		Short:         "vmsan: a software SAN for KVM/QEMU virtual-machine disks",
		SilenceUsage:  true,
		SilenceErrors: true,
		// `vmsan --version` too, as users try both.
		Version: version.Get().Version,
	}
	root.AddCommand(
		newBenchCmd(),
		newDoctorCmd(),
		newEventsCmd(),
		newGenManCmd(),
		newISCSICmd(),
		newReplCmd(),
		newServeCmd(),
		newStatusCmd(),
		newVersionCmd(),
		newVolumeCmd(),
	)
	finishTree(root)
	return root
}

// Exit statuses: 0 success, 1 the command failed, 2 the command line
// names no command (an unknown subcommand).
const (
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	cmd, err := newRootCmd().ExecuteC()
	if err == nil {
		return
	}
	code := exitFailed
	var ue usageError
	if errors.As(err, &ue) {
		code = exitUsage
	}
	reportError(os.Stderr, cmd, err)
	os.Exit(code)
}

// reportError prints a failed command's error on w: as one JSON object
// {"error": MESSAGE, "code": CODE} when the command was given --json (so a
// script reading JSON gets JSON; stdout keeps only the command's result),
// else as "vmsan: MESSAGE". CODE is the control API's error code
// ("not_found", "exists", "in_use", ...) when the error has one.
func reportError(w io.Writer, cmd *cobra.Command, err error) {
	if cmd != nil && wantsJSON(cmd) {
		e := struct {
			Error string `json:"error"`
			Code  string `json:"code,omitempty"`
		}{Error: err.Error(), Code: daemon.ErrorCode(err)}
		b, merr := json.Marshal(e)
		if merr == nil {
			fmt.Fprintln(w, string(b))
			return
		}
	}
	fmt.Fprintln(w, "vmsan:", err)
}

// wantsJSON reports whether cmd was run with --json.
func wantsJSON(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("json")
	return f != nil && f.Value.String() == "true"
}

// usageError is a command line that names no command: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// finishTree makes every command that only groups subcommands (vmsan
// volume, vmsan repl, ...) refuse an unknown subcommand with exit status
// 2 and cobra's "did you mean" suggestion; without arguments it still
// prints its help. Cobra itself does that only for the root command: a
// parent without Run prints help and exits 0 on "vmsan volume craete".
// Called before Execute (and by tests on the whole tree).
func finishTree(root *cobra.Command) {
	// help and completion are added by Execute; add them now so they get
	// the same treatment.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		// Cobra defaults the distance only on the root command.
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2
		}
		if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
			c.Args = unknownSubcommand
			c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
		for _, sc := range c.Commands() {
			walk(sc)
		}
	}
	walk(root)
}

// unknownSubcommand is the Args of a parent command: any argument is an
// unknown subcommand.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	msg += fmt.Sprintf("\n\nRun '%s --help' for the list of commands.", cmd.CommandPath())
	return usageError{msg}
}
