package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vmsan/vmsan/internal/version"
)

// gen-man writes the man pages `make install` installs. It is hidden: it is
// a build step, not something users run. Shell completions need no
// generator of ours: cobra's `vmsan completion bash|zsh|fish` prints them.
func init() {
	cmd := &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write man pages (section 1) for every command into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			hdr := &doc.GenManHeader{Title: "VMSAN", Section: "1", Source: "vmsan " + version.Get().Version, Manual: "vmsan manual"}
			// The Makefile sets SOURCE_DATE_EPOCH to the last commit's time
			// so the same source gives byte-identical pages (and .deb);
			// without it cobra dates the pages today.
			if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
				hdr.Date = sourceDate(s)
			}
			rootCmd.DisableAutoGenTag = true
			if err := doc.GenManTree(rootCmd, hdr, dir); err != nil {
				return err
			}
			n, _ := filepath.Glob(filepath.Join(dir, "*.1"))
			fmt.Fprintf(os.Stderr, "gen-man: %d pages in %s\n", len(n), dir)
			return nil
		},
	}
	rootCmd.AddCommand(cmd)
}

// sourceDate parses SOURCE_DATE_EPOCH (seconds since 1970, the
// reproducible-builds convention); a bad value falls back to the epoch.
func sourceDate(s string) *time.Time {
	var sec int64
	if _, err := fmt.Sscan(s, &sec); err != nil {
		sec = 0
	}
	t := time.Unix(sec, 0).UTC()
	return &t
}
