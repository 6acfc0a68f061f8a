package main

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// exitCode runs the real binary and returns its combined output and exit
// status.
func exitCode(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(binary(t), args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("vmsan %s: %v", strings.Join(args, " "), err)
	return "", 0
}

// typo swaps two letters of name (create -> craete), or returns "" for a
// name too short to have a typo cobra would recognise.
func typo(name string) string {
	if len(name) < 4 {
		return ""
	}
	b := []byte(name)
	b[2], b[3] = b[3], b[2]
	if string(b) == name {
		return ""
	}
	return string(b)
}

// TestUnknownSubcommandExits2: every command of the tree that groups
// subcommands (found by walking the cobra tree, so a new one is covered
// without listing it) refuses an unknown subcommand with exit status 2,
// and a typo of one of its subcommands with a "did you mean" naming it;
// with no argument it prints its help and exits 0.
func TestUnknownSubcommandExits2(t *testing.T) {
	// The tree as main builds it (finishTree adds help and completion).
	rootCmd := newRootCmd()
	type parent struct {
		path     []string
		c        *cobra.Command
		grouping bool // runs nothing itself: every argument is a subcommand
	}
	var parents []parent
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasSubCommands() {
			parents = append(parents, parent{strings.Fields(c.CommandPath())[1:], c, c.Run == nil && c.RunE == nil || isGroup(c)})
		}
		for _, sc := range c.Commands() {
			walk(sc)
		}
	}
	walk(rootCmd)
	if len(parents) < 4 {
		t.Fatalf("only %d parent commands found", len(parents))
	}
	for _, p := range parents {
		name := strings.Join(append([]string{"vmsan"}, p.path...), " ")
		if p.grouping {
			out, code := exitCode(t, append(p.path, "xyzzy-nope")...)
			if code != exitUsage || !strings.Contains(out, `unknown command "xyzzy-nope"`) {
				t.Errorf("%s xyzzy-nope: exit %d, want %d:\n%s", name, code, exitUsage, out)
			}
			if out, code := exitCode(t, p.path...); code != 0 || !strings.Contains(out, "Available Commands") {
				t.Errorf("%s: exit %d, want its help and 0:\n%s", name, code, out)
			}
		}
		// A typo of one of its subcommands, also where the parent takes
		// an operand (vmsan bench TARGET: a missing TARGET close to a
		// subcommand's name).
		for _, sc := range p.c.Commands() {
			ty := typo(sc.Name())
			if !sc.IsAvailableCommand() || ty == "" {
				continue
			}
			out, code := exitCode(t, append(p.path, ty)...)
			if code != exitUsage || !strings.Contains(strings.ToLower(out), "did you mean") || !strings.Contains(out, sc.Name()) {
				t.Errorf("%s %s: exit %d, want %d and a suggestion of %q:\n%s", name, ty, code, exitUsage, sc.Name(), out)
			}
			break // one typo per parent keeps the test quick
		}
	}
}

// isGroup reports whether c is a grouping command finishTree already
// prepared (its Args refuse any argument as an unknown subcommand).
func isGroup(c *cobra.Command) bool {
	return c.Args != nil && errors.As(c.Args(c, []string{"xyzzy-nope"}), new(usageError))
}

// TestPrintConfigMasksSecrets: `serve --print-config` shows the
// configuration with every CHAP secret masked (the real binary, a real
// config file).
func TestPrintConfigMasksSecrets(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "vmsan.yaml")
	if err := os.WriteFile(cfg, []byte(`data_dir: `+filepath.Join(dir, "data")+`
iscsi:
  listen: ["127.0.0.1:3260"]
  auth: {user: u, secret: "one-secret-12", mutual_user: t, mutual_secret: "two-secret-34"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := exitCode(t, "serve", "--config", cfg, "--print-config")
	if code != 0 || strings.Contains(out, "one-secret-12") || strings.Contains(out, "two-secret-34") || !strings.Contains(out, "********") {
		t.Fatalf("print-config: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Fatal("print-config created the data directory")
	}
}

// TestPrintConfigNBDSection: a file with the old top-level NBD keys still
// loads; `serve --print-config` writes them under nbd: and notes each
// deprecated key (the real binary, a real config file).
func TestPrintConfigNBDSection(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "vmsan.yaml")
	if err := os.WriteFile(cfg, []byte("data_dir: "+filepath.Join(dir, "data")+"\nlisten: [\"127.0.0.1:10899\"]\nmax_connections: 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := exitCode(t, "serve", "--config", cfg, "--print-config")
	if code != 0 || !strings.Contains(out, "\nnbd:\n") || !strings.Contains(out, "127.0.0.1:10899") ||
		strings.Contains(out, "\nlisten:") || !strings.Contains(out, `top-level "listen" is deprecated`) ||
		!strings.Contains(out, `top-level "max_connections" is deprecated`) {
		t.Fatalf("print-config: exit %d\n%s", code, out)
	}
}

// TestDoctorTypoDataDir: a --data-dir that does not exist fails the
// doctor (exit 1, a fail row naming it) instead of passing as a host
// with no volumes.
func TestDoctorTypoDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vmsan-dtaa")
	out, code := exitCode(t, "doctor", "--data-dir", dir, "--no-history", "--json")
	if code != 1 {
		t.Fatalf("doctor --data-dir %s: exit %d, want 1\n%s", dir, code, out)
	}
	var rows []map[string]string
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "]")+1]), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	found := false
	for _, r := range rows {
		if r["check"] == "datadir" {
			found = r["status"] == "fail" && r["subject"] == dir && r["fix"] != ""
		}
	}
	if !found {
		t.Fatalf("no failing datadir row for %s:\n%s", dir, out)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("doctor created the data directory")
	}
}

// TestBenchRefusesZeroDepth: --iodepth 0 (and --jobs 0) are refused with
// a clear error before anything runs, instead of running at QD1.
func TestBenchRefusesZeroDepth(t *testing.T) {
	f := filepath.Join(t.TempDir(), "scratch")
	for _, fl := range []string{"--iodepth", "--jobs"} {
		out, code := exitCode(t, "bench", "-p", "job", fl, "0", "--size", "1M", "--runtime", "0", "-o", "none", "-q", f)
		if code == 0 || !strings.Contains(out, fl+" 0: must be at least 1") {
			t.Errorf("bench %s 0: exit %d\n%s", fl, code, out)
		}
	}
	if _, err := os.Stat(f); err == nil {
		t.Error("the refused benchmark created its scratch file")
	}
}

// TestFailedStartCreatesNothing: `serve --listen` on a port in use fails
// before any volume is created (the default one included), so a failed
// start leaves the data directory without volumes; the same directory
// then starts (and gets its default volume) once the port is free.
func TestFailedStartCreatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := filepath.Join(t.TempDir(), "data")
	out, code := exitCode(t, "serve", "--data-dir", data, "--listen", ln.Addr().String())
	if code == 0 || !strings.Contains(out, "address already in use") {
		t.Fatalf("serve on a port in use: exit %d\n%s", code, out)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "volumes", "*")); len(m) != 0 {
		t.Fatalf("a failed start left volume files: %v\n%s", m, out)
	}
	out, code = exitCode(t, "volume", "list", "--data-dir", data, "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("volume list after the failed start: exit %d\n%s", code, out)
	}
}
