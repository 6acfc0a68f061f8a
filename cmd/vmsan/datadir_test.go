package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTypoDataDirNotCreated: commands that read or change existing volumes
// fail on a data directory that does not exist, naming it and how one is
// made, and leave nothing behind; creating a volume creates it.
func TestTypoDataDirNotCreated(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "vmsan-dtaa")
	for _, args := range [][]string{
		{"volume", "list"},
		{"volume", "info", "vm1"},
		{"volume", "resize", "vm1", "+1G"},
		{"volume", "set", "vm1", "--rotational"},
		{"volume", "delete", "vm1"},
		{"volume", "repair", "vm1", "--recreate"},
		{"status"},
		{"repl", "status"},
		{"events", "--now"},
	} {
		out, err := runCLI(t, append(args, "--data-dir", dir)...)
		want := "no vmsan data directory at " + dir + " (create it with `vmsan serve` or `vmsan volume create`)"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("vmsan %s: err %v, want it to contain %q\n%s", strings.Join(args, " "), err, want, out)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("vmsan %s created %s", strings.Join(args, " "), dir)
		}
	}
	if out, err := runCLI(t, "volume", "create", "vm1", "--size", "1M", "--data-dir", dir); err != nil {
		t.Fatalf("volume create: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "volume", "list", "--data-dir", dir); err != nil || !strings.Contains(out, "vm1") {
		t.Fatalf("volume list after create: %v\n%s", err, out)
	}
}
