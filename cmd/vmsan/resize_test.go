package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/volume"
)

// runCLI runs the vmsan command line in-process and returns its stdout.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	old := os.Stdout
	r, w, _ := os.Pipe()
	os.Stdout = w
	rootCmd := newRootCmd()
	rootCmd.SetArgs(args)
	err := rootCmd.Execute()
	w.Close()
	os.Stdout = old
	var b bytes.Buffer
	b.ReadFrom(r)
	return b.String(), err
}

// TestResizeRelative: "+SIZE" grows by SIZE; "-SIZE" (after "--") shrinks
// by it and, like any shrink, needs --force.
func TestResizeRelative(t *testing.T) {
	dir := t.TempDir()
	if out, err := runCLI(t, "volume", "create", "vm1", "--size", "1G", "--data-dir", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := runCLI(t, "volume", "resize", "vm1", "+512M", "--data-dir", dir); err != nil || !strings.Contains(out, "(1610612736 bytes)") {
		t.Fatalf("resize +512M: %v\n%s", err, out)
	}
	out, err := runCLI(t, "volume", "resize", "vm1", "--data-dir", dir, "--", "-1G")
	if err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("shrink without --force: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "volume", "resize", "vm1", "--force", "--data-dir", dir, "--", "-1G"); err != nil || !strings.Contains(out, "(536870912 bytes)") {
		t.Fatalf("resize -1G --force: %v\n%s", err, out)
	}
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m, err := s.Get("vm1"); err != nil || m.Size != 512<<20 {
		t.Fatalf("size %d, %v", m.Size, err)
	}
}
