package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vmsan/vmsan/internal/version"
)

// gen-man writes the man pages `make install` installs. It is hidden: it is
// a build step, not something users run. Shell completions need no
// generator of ours: cobra's `vmsan completion bash|zsh|fish` prints them.
func newGenManCmd() *cobra.Command {
	var docDir, shareDir, configPath string
	cmd := &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write man pages (section 1) for every command into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			root := cmd.Root()
			root.DisableAutoGenTag = true
			if err := doc.GenManTree(root, hdr, dir); err != nil {
				return err
			}
			n, _ := filepath.Glob(filepath.Join(dir, "*.1"))
			files := manFiles(configPath, docDir, shareDir)
			for _, p := range n {
				if err := addManSection(p, files); err != nil {
					return err
				}
			}
			fmt.Fprintf(os.Stderr, "gen-man: %d pages in %s\n", len(n), dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&docDir, "doc-dir", "/usr/share/doc/vmsan", "where README.md and docs/ are installed (named in FILES)")
	cmd.Flags().StringVar(&shareDir, "share-dir", "/usr/share/vmsan", "where the dashboard and alert rules are installed (named in FILES)")
	cmd.Flags().StringVar(&configPath, "config-path", "/etc/vmsan/vmsan.yaml", "the installed service configuration (named in FILES)")
	return cmd
}

// manFiles is the FILES section of every page: the help texts refer to
// "docs/NAME.md", which a reader of an installed page finds under docDir.
func manFiles(configPath, docDir, shareDir string) string {
	return fmt.Sprintf(`.SH FILES
.TP
%s
the service's configuration (vmsan.service runs vmsan serve --config with it)
.TP
%s/
README.md, and docs/*.md: the documents the text above names as docs/NAME.md
(compressed when large: zless docs/NAME.md.gz)
.TP
%s/grafana-dashboard.json
Grafana dashboard of the metrics (import it, pick the Prometheus data source)
.TP
%s/prometheus-alerts.yaml
Prometheus alert rules (add to rule_files)
`, configPath, docDir, shareDir, shareDir)
}

// addManSection inserts section before the page's SEE ALSO (or appends it).
func addManSection(path, section string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	if i := strings.Index(s, ".SH SEE ALSO"); i >= 0 {
		s = s[:i] + section + s[i:]
	} else {
		s += section
	}
	return os.WriteFile(path, []byte(s), 0o644)
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
